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

ShardCut cut_shard(const ChunkStore& store, const Coordinator& coordinator,
                   std::uint64_t config_hash, SnapshotKind kind) {
  ShardCut cut;
  cut.info.kind = kind;
  cut.info.config_hash = config_hash;
  cut.info.optimizer = to_string(store.optimizer().kind);
  coordinator.fill_progress(cut.info);
  cut.chunks = store.refs();
  return cut;
}

void write_shard(const std::filesystem::path& file, const ShardCut& cut) {
  write_snapshot(file, cut.info, record_views(cut.chunks));
}

std::filesystem::path shard_file(const std::filesystem::path& dir, std::uint32_t ps_index) {
  return dir / ("ps" + std::to_string(ps_index) + ".bin");
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

// Refuses a file whose state or progress belongs elsewhere, then loads it.
RestoredShard load(ChunkStore& store, const std::filesystem::path& file, Snapshot snap,
                   std::uint64_t config_hash) {
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
  try {
    store.restore(std::move(snap.records));
  } catch (const std::invalid_argument& e) {
    throw SnapshotError(file.string() + ": " + e.what());
  }
  RestoredShard out{file, std::move(snap), 0};
  if (out.info.kind == SnapshotKind::checkpoint)
    out.checkpoint_seq = generation_seq(file.parent_path().filename().string()).value_or(0);
  log("restored ", store.size(), " chunks (", store.elements(), " values) and ",
      out.info.global_samples, " global samples from ", file.string());
  return out;
}

}  // namespace

RestoredShard restore_shard(ChunkStore& store, const std::filesystem::path& dir,
                            std::uint32_t ps_index, std::size_t servers,
                            std::uint64_t config_hash) {
  const auto file = shard_file(dir, ps_index);
  auto snap = read_snapshot(file);
  if (snap.kind == SnapshotKind::snapshot) check_servers(dir, servers);
  return load(store, file, std::move(snap), config_hash);
}

std::optional<RestoredShard> restore_latest(ChunkStore& store,
                                            const std::filesystem::path& checkpoints,
                                            std::uint32_t ps_index, std::uint64_t config_hash) {
  const auto seqs = generations(checkpoints);
  for (auto it = seqs.rbegin(); it != seqs.rend(); ++it) {
    const auto file = shard_file(generation_dir(checkpoints, *it), ps_index);
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) continue;
    Snapshot snap;
    try {
      snap = read_snapshot(file);
    } catch (const SnapshotError& e) {
      log("checkpoint ", file.string(), " is unusable (", e.what(), "); trying an older one");
      continue;
    }
    return load(store, file, std::move(snap), config_hash);
  }
  log("no usable checkpoint of ps ", ps_index, " in ", checkpoints.string(),
      "; starting from fresh values");
  return std::nullopt;
}

}  // namespace pstrain::ps
