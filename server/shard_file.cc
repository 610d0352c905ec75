#include "server/shard_file.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "shared/log.h"

namespace pstrain::ps {
namespace {

constexpr std::string_view kGenerationPrefix = "ckpt-";

std::optional<std::uint64_t> generation_seq(const std::string& name) {
  if (!name.starts_with(kGenerationPrefix)) return std::nullopt;
  std::uint64_t seq = 0;
  const char* first = name.data() + kGenerationPrefix.size();
  const char* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, seq);
  if (ec != std::errc() || end != last || first == last) return std::nullopt;
  return seq;
}

std::string hash_text(std::uint64_t hash) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

// The shard map depends on the number of servers: a folder of another layout
// would restore some chunks and leave others to be created fresh.
void check_servers(const std::filesystem::path& dir, std::size_t servers) {
  std::size_t files = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (name.starts_with("ps") && name.ends_with(".bin")) ++files;
  }
  if (!ec && files != servers)
    throw SnapshotError("snapshot " + dir.string() + " holds " + std::to_string(files) +
                        " ps files, this cluster has " + std::to_string(servers) +
                        " parameter servers; restore with the same ps list");
}

}  // namespace

ShardCut cut_shard(const Shard& shard, CutKind kind, std::uint64_t previous) {
  ShardCut cut;
  cut.info.kind = kind == CutKind::snapshot ? SnapshotKind::snapshot : SnapshotKind::checkpoint;
  cut.info.config_hash = shard.config_hash;
  cut.info.optimizer = to_string(shard.store.optimizer().kind);
  cut.info.previous = kind == CutKind::checkpoint_delta ? previous : 0;
  shard.coordinator.fill_progress(cut.info);
  cut.chunks = shard.store.refs();
  cut.tables = shard.tables.cut(kind);
  return cut;
}

void write_shard(const std::filesystem::path& file, const ShardCut& cut) {
  write_snapshot(file, cut.info, record_views(cut.chunks), cut.tables.views());
}

std::filesystem::path shard_file(const std::filesystem::path& dir, std::uint32_t ps_index) {
  return dir / ("ps" + std::to_string(ps_index) + ".bin");
}

std::filesystem::path delta_file(const std::filesystem::path& dir, std::uint32_t ps_index) {
  return dir / ("ps" + std::to_string(ps_index) + ".delta.bin");
}

std::filesystem::path checkpoints_dir(const std::filesystem::path& run_dir) {
  return run_dir / "checkpoints";
}

std::filesystem::path generation_dir(const std::filesystem::path& checkpoints, std::uint64_t seq) {
  return checkpoints / (std::string(kGenerationPrefix) + std::to_string(seq));
}

std::vector<std::uint64_t> generations(const std::filesystem::path& checkpoints) {
  std::vector<std::uint64_t> seqs;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints, ec))
    if (const auto seq = generation_seq(entry.path().filename().string());
        seq && entry.is_directory(ec))
      seqs.push_back(*seq);
  std::ranges::sort(seqs);
  return seqs;
}

namespace {

// A file and what it holds, newest first in a chain.
struct ChainLink {
  std::filesystem::path file;
  Snapshot snap;
};

// This ps's file of generation `seq`, whole or delta; empty when it has none.
std::filesystem::path checkpoint_file(const std::filesystem::path& checkpoints, std::uint64_t seq,
                                      std::uint32_t ps_index) {
  const auto dir = generation_dir(checkpoints, seq);
  std::error_code ec;
  for (const auto& file : {shard_file(dir, ps_index), delta_file(dir, ps_index)})
    if (std::filesystem::exists(file, ec)) return file;
  return {};
}

// `file` and, while the newest link is a delta, the generations it
// continues, back to a whole file. Throws SnapshotError naming the file
// that is missing or unreadable.
std::vector<ChainLink> read_chain(const std::filesystem::path& file, std::uint32_t ps_index) {
  std::vector<ChainLink> chain;
  chain.push_back({file, read_snapshot(file)});
  while (chain.back().snap.previous != 0) {
    const auto previous = chain.back().snap.previous;
    const auto checkpoints = chain.back().file.parent_path().parent_path();
    const auto base = checkpoint_file(checkpoints, previous, ps_index);
    if (base.empty())
      throw SnapshotError(chain.back().file.string() + " is a delta of generation " +
                          std::to_string(previous) + ", of which ps " + std::to_string(ps_index) +
                          " has no file in " + checkpoints.string());
    chain.push_back({base, read_snapshot(base)});
  }
  return chain;
}

// Refuses a chain whose state or progress belongs elsewhere, then loads it:
// the chunks and progress of the newest file, the tables of the whole one
// with the deltas after it applied in order.
RestoredShard load(ChunkStore& store, TableStore& tables, std::vector<ChainLink> chain,
                   std::uint64_t config_hash) {
  const auto& file = chain.front().file;
  auto& snap = chain.front().snap;
  const std::string ours(to_string(store.optimizer().kind));
  if (!snap.optimizer.empty() && snap.optimizer != ours)
    throw SnapshotError(file.string() + " was written with optimizer " + snap.optimizer +
                        ", this run uses " + ours + "; its state does not fit");
  if (snap.kind == SnapshotKind::checkpoint && snap.config_hash != config_hash)
    throw SnapshotError(file.string() +
                        " is a checkpoint of another run or configuration (config hash " +
                        hash_text(snap.config_hash) + ", this run has " + hash_text(config_hash) +
                        "); resume with the same cluster.yaml and --set overrides, or seed a "
                        "new run from an end-of-run snapshot");
  for (auto link = chain.rbegin(); link != chain.rend(); ++link) try {
      for (const auto& table : link->snap.tables) tables.restore(table, link->snap.previous != 0);
    } catch (const std::invalid_argument& e) {
      throw SnapshotError(link->file.string() + ": " + e.what());
    }
  try {
    store.restore(std::move(snap.records));
  } catch (const std::invalid_argument& e) {
    throw SnapshotError(file.string() + ": " + e.what());
  }
  RestoredShard out{file, std::move(snap), 0};
  if (out.info.kind == SnapshotKind::checkpoint)
    out.checkpoint_seq = generation_seq(file.parent_path().filename().string()).value_or(0);
  std::uint64_t rows = 0;
  for (const auto& t : tables.figures()) rows += t.rows;
  log("restored ", store.size(), " chunks (", store.elements(), " values), ", rows,
      " table rows and ", out.info.global_samples, " global samples from ", file.string(),
      chain.size() > 1 ? " and the " + std::to_string(chain.size() - 1) + " files it continues"
                       : std::string());
  return out;
}

}  // namespace

RestoredShard restore_shard(ChunkStore& store, TableStore& tables, const std::filesystem::path& dir,
                            std::uint32_t ps_index, std::size_t servers,
                            std::uint64_t config_hash) {
  std::error_code ec;
  auto file = shard_file(dir, ps_index);
  if (!std::filesystem::exists(file, ec) && std::filesystem::exists(delta_file(dir, ps_index), ec))
    file = delta_file(dir, ps_index);
  auto chain = read_chain(file, ps_index);
  if (chain.front().snap.kind == SnapshotKind::snapshot) check_servers(dir, servers);
  return load(store, tables, std::move(chain), config_hash);
}

std::optional<RestoredShard> restore_latest(ChunkStore& store, TableStore& tables,
                                            const std::filesystem::path& checkpoints,
                                            std::uint32_t ps_index, std::uint64_t config_hash) {
  const auto seqs = generations(checkpoints);
  for (auto it = seqs.rbegin(); it != seqs.rend(); ++it) {
    const auto file = checkpoint_file(checkpoints, *it, ps_index);
    if (file.empty()) continue;
    std::vector<ChainLink> chain;
    try {
      chain = read_chain(file, ps_index);
    } catch (const SnapshotError& e) {
      log("checkpoint ", file.string(), " is unusable (", e.what(), "); trying an older one");
      continue;
    }
    return load(store, tables, std::move(chain), config_hash);
  }
  log("no usable checkpoint of ps ", ps_index, " in ", checkpoints.string(),
      "; starting from fresh values");
  return std::nullopt;
}

}  // namespace pstrain::ps
