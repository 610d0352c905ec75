// Checkpoints of real `pstrain --role ps` processes (server/checkpointer.h,
// server/shard_file.h): written periodically while the ps serves and pruned
// to checkpoint.keep, written on SIGTERM, restored by `--restore latest` bit
// for bit (values, versions, optimizer state, progress), refused when they
// belong to another configuration or optimizer, skipped when damaged.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "client/ps/ps_client.h"
#include "server/shard_file.h"
#include "shared/snapshot.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;
using namespace std::chrono_literals;

namespace {

ShardMap shard_map(const ClusterConfig& c) {
  return shard_map_for(c, {{"w", 40000, {InitKind::uniform, 1.0f}}, {"b", 10, {}}});
}

void push_steps(PsClient& ps, std::uint32_t first, std::uint32_t last) {
  for (std::uint32_t s = first; s < last; ++s) {
    std::vector<float> gw(40000), gb(10);
    for (std::size_t i = 0; i < gw.size(); ++i) gw[i] = std::sin(0.37f * i + 1.3f * s);
    for (std::size_t i = 0; i < gb.size(); ++i) gb[i] = std::cos(0.5f * i + s);
    ps.wait(ps.push("w", gw));
    ps.wait(ps.push("b", gb));
  }
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What differs between two shard files: progress, and every record's
// version, values and optimizer state bit for bit. Empty when they agree.
std::string differences(const Snapshot& a, const Snapshot& b) {
  std::string out;
  if (a.global_samples != b.global_samples) out += "global samples; ";
  if (a.worker_samples != b.worker_samples) out += "worker samples; ";
  if (a.records.size() != b.records.size()) return out + "record count";
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    const auto &x = a.records[i], &y = b.records[i];
    const auto what = "'" + x.name + "' chunk " + std::to_string(x.chunk);
    if (x.name != y.name || x.chunk != y.chunk) out += what + ": other chunk; ";
    if (x.version != y.version) out += what + ": version; ";
    if (!same_floats(x.values, y.values)) out += what + ": values; ";
    if (!same_floats(x.state, y.state)) out += what + ": state; ";
  }
  return out;
}

std::filesystem::path checkpoint_file(const PsCluster& cluster, std::uint64_t seq,
                                      std::uint32_t ps) {
  return ps::shard_file(ps::generation_dir(ps::checkpoints_dir(cluster.dir()), seq), ps);
}

// A checkpoint of ps 0 holding one chunk "w" 0 at version 5.
void write_checkpoint(const std::filesystem::path& file, std::uint64_t config_hash,
                      const std::string& optimizer) {
  Snapshot s;
  s.kind = SnapshotKind::checkpoint;
  s.config_hash = config_hash;
  s.optimizer = optimizer;
  s.global_samples = 77;
  s.records.push_back({"w", 0, 5, {1.5f, -2.5f, 3.25f}, {}});
  std::filesystem::create_directories(file.parent_path());
  write_snapshot(file, s);
}

// Waits for the ps's exit after `--restore`; nullopt if it is still serving.
std::optional<int> exit_code(ChildProcess& ps) { return ps.wait_for(10s); }

}  // namespace

TEST_CASE("checkpoints: written every every_s while the ps serves, pruned to keep") {
  PsCluster cluster({.ps = 1,
                     .workers = 1,
                     .optimizer = "momentum",
                     .lr = 0.01,
                     .checkpoint_every_s = 0.2,
                     .checkpoint_keep = 2});
  auto& server = cluster.start_ps(0);
  const auto& config = cluster.config();
  PsClient ps(config, 0, shard_map(config));
  ps.hello();
  ps.init(3);
  const auto start = std::chrono::steady_clock::now();
  std::uint32_t steps = 0;
  while (std::chrono::steady_clock::now() - start < 1500ms) {
    push_steps(ps, steps, steps + 1);
    ++steps;
  }

  const auto checkpoints = ps::checkpoints_dir(cluster.dir());
  const auto seqs = ps::generations(checkpoints);
  INFO(server.log_text());
  // About 7 were due in 1.5 s; only the newest 2 are left.
  REQUIRE(seqs.size() == 2);
  CHECK(seqs[0] + 1 == seqs[1]);
  CHECK(seqs[1] >= 4);
  CHECK(server.log_text().find("checkpoint 3 of ") != std::string::npos);
  const auto newest = read_snapshot(checkpoint_file(cluster, seqs[1], 0));
  CHECK(newest.kind == SnapshotKind::checkpoint);
  CHECK(newest.config_hash == config.hash());
  CHECK(newest.optimizer == "momentum");
  // Taken while pushes went on: it holds some of them.
  std::uint64_t versions = 0;
  for (const auto& r : newest.records) versions += r.version;
  CHECK(versions > 0);
  CHECK(server.wait_for(0s) == std::nullopt);  // still serving
}

TEST_CASE(
    "checkpoints: SIGTERM writes one; --restore latest gives back values, versions, "
    "optimizer state and progress bit for bit") {
  PsCluster cluster(
      {.ps = 2, .workers = 2, .optimizer = "adam", .lr = 0.01, .checkpoint_every_s = 3600});
  cluster.start_all();
  const auto& config = cluster.config();
  std::vector<Snapshot> before;
  {
    PsClient w0(config, 0, shard_map(config)), w1(config, 1, shard_map(config));
    w0.hello();
    w1.hello();
    w0.init(7);
    push_steps(w0, 0, 5);
    push_steps(w1, 5, 7);
    w0.report_progress(100, {0, 1});
    w1.report_progress(30, {0, 1});
    for (std::uint32_t s = 0; s < 2; ++s) before.push_back(read_snapshot(w0.snapshot(s)));
  }
  for (std::uint32_t s = 0; s < 2; ++s) {
    // What the test compares against is not trivial.
    CHECK(before[s].worker_samples == std::vector<std::uint64_t>{100, 30});
    CHECK(before[s].records.size() > 1);
    cluster.ps(s).kill(SIGTERM);
    REQUIRE(cluster.ps(s).wait_for(10s) == 0);
    const auto file = checkpoint_file(cluster, 1, s);
    REQUIRE_MESSAGE(std::filesystem::exists(file), cluster.ps(s).log_text());
    const auto saved = read_snapshot(file);
    CHECK(saved.kind == SnapshotKind::checkpoint);
    CHECK(saved.optimizer == "adam");
    const auto diff = differences(before[s], saved);
    CHECK_MESSAGE(diff.empty(), "ps ", s, " checkpoint: ", diff);
  }

  for (std::uint32_t s = 0; s < 2; ++s) cluster.start_ps(s, {"--restore", "latest"});
  PsClient tool(config, 1000, shard_map(config));
  for (std::uint32_t s = 0; s < 2; ++s) {
    // The restored ps's own snapshot holds exactly what the first one had.
    const auto after = read_snapshot(tool.snapshot(s));
    const auto diff = differences(before[s], after);
    CHECK_MESSAGE(diff.empty(), "ps ", s, " restored: ", diff);
    CHECK_MESSAGE(cluster.ps(s).log_text().find("restored_from 1, ") != std::string::npos,
                  cluster.ps(s).log_text());
  }
}

TEST_CASE("checkpoints: one of another configuration or optimizer is refused, naming both") {
  PsCluster cluster({.ps = 1, .workers = 1, .optimizer = "sgd"});
  const auto file = checkpoint_file(cluster, 4, 0);
  std::string expected;
  SUBCASE("config hash") {
    write_checkpoint(file, cluster.config().hash() ^ 1, "sgd");
    expected = "is a checkpoint of another run or configuration (config hash";
  }
  SUBCASE("optimizer") {
    write_checkpoint(file, cluster.config().hash(), "adam");
    expected = "was written with optimizer adam, this run uses sgd";
  }
  auto& ps = cluster.start_ps(0, {"--restore", "latest"});
  REQUIRE(exit_code(ps) == 2);
  CHECK_MESSAGE(ps.log_text().find(file.string() + " " + expected) != std::string::npos,
                ps.log_text());
}

TEST_CASE("checkpoints: a damaged newest file is named and the next older one restored") {
  PsCluster cluster({.ps = 1, .workers = 1, .optimizer = "sgd"});
  const auto good = checkpoint_file(cluster, 1, 0), damaged = checkpoint_file(cluster, 2, 0);
  write_checkpoint(good, cluster.config().hash(), "sgd");
  std::filesystem::create_directories(damaged.parent_path());
  std::ofstream(damaged) << "PSTRSNAP truncated";
  auto& ps = cluster.start_ps(0, {"--restore", "latest"});
  const auto mismatches = restored_mismatches(cluster.config(), good.parent_path());
  CHECK_MESSAGE(mismatches.empty(), mismatches);
  const auto log = ps.log_text();
  CHECK_MESSAGE(log.find("checkpoint " + damaged.string() + " is unusable") != std::string::npos,
                log);
  CHECK_MESSAGE(log.find("restored_from 1, ") != std::string::npos, log);
  CHECK(ps.wait_for(0s) == std::nullopt);
}

TEST_CASE("checkpoints: --restore latest without any checkpoint starts fresh, saying so") {
  PsCluster cluster({.ps = 1, .workers = 1});
  auto& ps = cluster.start_ps(0, {"--restore", "latest"});
  PsClient tool(cluster.config(), 1000, shard_map(cluster.config()));
  CHECK(tool.stats(0).find("\"chunks\":0") != std::string::npos);
  const auto log = ps.log_text();
  CHECK_MESSAGE(log.find("no usable checkpoint of ps 0") != std::string::npos, log);
  CHECK_MESSAGE(log.find("restored_from 0, ") != std::string::npos, log);
}
