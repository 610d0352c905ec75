// Concurrent updates from several client processes against 2 real
// `pstrain --role ps` processes: with SGD, lr = 1 and integer gradients every
// update is exact, so the final values must equal initial - sum of all pushes
// bit for bit (no update lost or applied twice). The staleness a client
// reports, from versions the test controls. Also snapshot and restore with
// Adam, whose state makes any difference visible in later updates.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "client/ps_client.h"
#include "shared/snapshot.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

std::vector<VariableSpec> variables() {
  // "w" spans many 64 KiB chunks on both servers; "b" is one small chunk.
  return {{"w", 40000, {InitKind::uniform, 1.0f}}, {"b", 10, {InitKind::zeros, 0}}};
}

ShardMap shard_map(const ClusterConfig& c) {
  return shard_map_for(c, variables());
}

// Gradient of client k at step s for element i: an integer in [-1, 3], so
// the sums do not cancel.
float grad(std::uint32_t k, std::uint32_t s, std::size_t i) {
  return static_cast<float>((k * 7 + s * 3 + i) % 5) - 1.0f;
}

std::vector<float> pull_all(PsClient& ps, const std::string& name, std::size_t n) {
  std::vector<float> v(n);
  ps.wait(ps.pull(name, v));
  return v;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("ps: 3 client processes pushing concurrently lose no update") {
  PsCluster cluster({.ps = 2, .workers = 3, .optimizer = "sgd", .lr = 1});
  cluster.start_all();
  const auto& config = cluster.config();
  constexpr std::uint32_t kClients = 3, kSteps = 1500;

  // Integer initial values, so every later value is exactly representable.
  std::vector<float> w0(40000), b0(10);
  for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = static_cast<float>(i % 1000) - 500;
  for (std::size_t i = 0; i < b0.size(); ++i) b0[i] = static_cast<float>(i) * 3;
  {
    PsClient setup(config, 0, shard_map(config));
    setup.hello();
    setup.init(1);
    setup.wait(setup.assign("w", w0));
    setup.wait(setup.assign("b", b0));
  }

  std::vector<std::unique_ptr<ForkedClient>> clients;
  for (std::uint32_t k = 0; k < kClients; ++k) {
    clients.push_back(std::make_unique<ForkedClient>([&, k] {
      PsClient ps(config, k, shard_map(config));
      ps.hello();
      // Two steps in flight at once, alternating push and push_pull, so
      // replies of different tickets interleave.
      std::vector<float> gw[2] = {std::vector<float>(40000), std::vector<float>(40000)};
      std::vector<float> gb[2] = {std::vector<float>(10), std::vector<float>(10)};
      std::vector<float> out(40000);
      PsClient::Ticket pending[2][2] = {};
      for (std::uint32_t s = 0; s < kSteps; ++s) {
        const auto slot = s % 2;
        if (pending[slot][0]) {
          ps.wait(pending[slot][0]);
          ps.wait(pending[slot][1]);
        }
        for (std::size_t i = 0; i < gw[slot].size(); ++i) gw[slot][i] = grad(k, s, i);
        for (std::size_t i = 0; i < gb[slot].size(); ++i) gb[slot][i] = grad(k, s, i);
        pending[slot][0] = (s % 4 == 3 && slot == 1) ? ps.push_pull("w", gw[slot], out)
                                                     : ps.push("w", gw[slot]);
        pending[slot][1] = ps.push("b", gb[slot]);
      }
      ps.wait_all();
    }));
  }
  for (auto& c : clients) REQUIRE(c->wait_for(std::chrono::seconds(120)) == 0);

  std::vector<float> w_expect = w0, b_expect = b0;
  for (std::uint32_t k = 0; k < kClients; ++k)
    for (std::uint32_t s = 0; s < kSteps; ++s) {
      for (std::size_t i = 0; i < w_expect.size(); ++i) w_expect[i] -= grad(k, s, i);
      for (std::size_t i = 0; i < b_expect.size(); ++i) b_expect[i] -= grad(k, s, i);
    }
  PsClient check(config, 0, shard_map(config));
  CHECK(bit_equal(pull_all(check, "w", 40000), w_expect));
  CHECK(bit_equal(pull_all(check, "b", 10), b_expect));
  // The expected values are not trivially the initial ones.
  CHECK_FALSE(bit_equal(w_expect, w0));
  for (std::uint32_t s = 0; s < 2; ++s) {
    const auto stats = check.stats(s);
    CHECK(stats.find("\"errors\":0") != std::string::npos);
  }
}

TEST_CASE("ps: staleness counts the updates others applied between a pull and a push") {
  PsCluster cluster({.ps = 2, .workers = 2});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient a(config, 0, shard_map(config)), b(config, 1, shard_map(config));
  a.init(1);
  REQUIRE(shard_map(config).chunks(0).size() > 2);  // "w" spans chunks on both servers
  const std::vector<float> grad(40000, 0.5f);
  std::vector<float> out(40000);
  auto others_push = [&](int n) {
    for (int i = 0; i < n; ++i) b.wait(b.push("w", grad));
  };

  a.wait(a.pull("w", out));
  others_push(3);
  a.wait(a.push_pull("w", grad, out));  // pulled, then 3 other updates, then this one
  CHECK(a.last_staleness("w") == 3);
  others_push(2);
  a.wait(a.push("w", grad));  // 2 since the push_pull's values
  CHECK(a.last_staleness("w") == 2);
  a.wait(a.pull("w", out));
  a.wait(a.push("w", grad));  // nobody in between
  CHECK(a.last_staleness("w") == 0);
  // b never pulled, so all 8 updates so far (5 of its own, 3 of a's) count.
  b.wait(b.push("w", grad));
  CHECK(b.last_staleness("w") == 8);
}

TEST_CASE("ps: a restored snapshot continues bit-identically (adam)") {
  PsCluster cluster({.ps = 2, .workers = 1, .optimizer = "adam", .lr = 0.01});
  cluster.start_all();
  const auto& config = cluster.config();
  auto gradients = [](std::uint32_t step, std::size_t n) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * i + 1.3f * step);
    return g;
  };
  auto push_steps = [&](PsClient& ps, std::uint32_t first, std::uint32_t last) {
    for (std::uint32_t s = first; s < last; ++s) {
      const auto gw = gradients(s, 40000), gb = gradients(s, 10);
      ps.wait(ps.push("w", gw));
      ps.wait(ps.push("b", gb));
    }
  };

  std::vector<float> at_snapshot_w, continued_w, continued_b;
  std::vector<std::string> paths;
  {
    PsClient ps(config, 0, shard_map(config));
    ps.hello();
    ps.init(7);
    push_steps(ps, 0, 5);
    for (std::uint32_t s = 0; s < 2; ++s) paths.push_back(ps.snapshot(s));
    at_snapshot_w = pull_all(ps, "w", 40000);
    push_steps(ps, 5, 10);
    continued_w = pull_all(ps, "w", 40000);
    continued_b = pull_all(ps, "b", 10);
    for (std::uint32_t s = 0; s < 2; ++s) ps.shutdown(s);
  }
  for (std::uint32_t s = 0; s < 2; ++s) {
    CHECK(paths[s] == (cluster.dir() / "snapshot" / ("ps" + std::to_string(s) + ".bin")).string());
    REQUIRE(cluster.ps(s).wait_for(std::chrono::seconds(10)) == 0);
  }

  for (std::uint32_t s = 0; s < 2; ++s)
    cluster.start_ps(s, {"--restore", (cluster.dir() / "snapshot").string()});
  // Every chunk holds the snapshot file's values and version, bit for bit.
  const auto mismatches = restored_mismatches(config, cluster.dir() / "snapshot");
  CHECK_MESSAGE(mismatches.empty(), mismatches);
  PsClient ps(config, 0, shard_map(config));
  ps.hello();
  CHECK(bit_equal(pull_all(ps, "w", 40000), at_snapshot_w));
  push_steps(ps, 5, 10);
  CHECK(bit_equal(pull_all(ps, "w", 40000), continued_w));
  CHECK(bit_equal(pull_all(ps, "b", 10), continued_b));
  // Adam's state matters: the same steps from fresh state give other values.
  CHECK_FALSE(bit_equal(continued_w, at_snapshot_w));
}

TEST_CASE("ps: a damaged snapshot stops the restoring ps with a message naming the file") {
  PsCluster cluster({.ps = 1});
  const auto dir = cluster.dir() / "snapshot";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "ps0.bin") << "PSTRSNAP truncated";
  auto& ps = cluster.start_ps(0, {"--restore", dir.string()});
  const auto code = ps.wait_for(std::chrono::seconds(10));
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(ps.log_text().find((dir / "ps0.bin").string()) != std::string::npos);
}

TEST_CASE("ps: a snapshot written by another number of servers is refused, saying so") {
  PsCluster cluster({.ps = 1});
  const auto dir = cluster.dir() / "snapshot";
  std::filesystem::create_directories(dir);
  write_snapshot(dir / "ps0.bin", {});
  write_snapshot(dir / "ps1.bin", {});
  auto& ps = cluster.start_ps(0, {"--restore", dir.string()});
  const auto code = ps.wait_for(std::chrono::seconds(10));
  REQUIRE(code.has_value());
  CHECK(*code == 2);
  CHECK_MESSAGE(ps.log_text().find("holds 2 ps files, this cluster has 1 parameter servers") !=
                    std::string::npos,
                ps.log_text());
}
