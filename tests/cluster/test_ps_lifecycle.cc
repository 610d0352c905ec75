// A real `pstrain --role ps`: when it exits (all workers done, silent
// workers, signals) and its control operations (barrier, key-value
// rendezvous, heartbeats with global sample counts).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <thread>

#include "client/ps_client.h"
#include "tests/support/ps_cluster.h"

using namespace pstrain;
using namespace pstrain::testing;
using namespace std::chrono_literals;

namespace {

ShardMap small_map(const ClusterConfig& c) {
  return shard_map_for(c, {{"w", 8, {}}});
}

}  // namespace

TEST_CASE("ps: exits 0 once every worker sent done, after replying") {
  PsCluster cluster({.ps = 2, .workers = 2});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config)), w1(config, 1, small_map(config));
  w0.hello();
  w1.hello();
  w0.done(100);
  CHECK_FALSE(cluster.ps(0).wait_for(300ms).has_value());  // worker 1 still running
  w1.done(200);
  for (std::uint32_t s = 0; s < 2; ++s) {
    CHECK(cluster.ps(s).wait_for(10s) == 0);
    CHECK(cluster.ps(s).log_text().find("all 2 workers done") != std::string::npos);
  }
}

TEST_CASE("ps: a silent worker makes the ps exit 3 naming it") {
  PsCluster cluster({.ps = 1, .workers = 2, .worker_timeout = 1.0});
  auto& ps = cluster.start_ps(0);
  const auto& config = cluster.config();
  // A short request timeout: the last heartbeat may be in flight when the ps exits.
  PsClientOptions options;
  options.timeout_s = 0.5;
  PsClient w0({config.ps[0].connect_address()}, small_map(config), config.hash(), options);
  w0.hello();
  // Worker 0 keeps talking, worker 1 never shows up.
  const auto start = std::chrono::steady_clock::now();
  std::optional<int> code;
  while (!code && std::chrono::steady_clock::now() - start < 10s) {
    try {
      w0.heartbeat(1);
    } catch (const PsError&) {
      // the ps exited while the heartbeat was in flight
    }
    code = ps.wait_for(200ms);
  }
  REQUIRE(code.has_value());
  CHECK(*code == 3);
  CHECK(ps.log_text().find("no message from worker(s) 1 for 1.0 s (net.worker_timeout); exiting") !=
        std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start >= 900ms);
}

TEST_CASE("ps: SIGTERM and SIGINT stop the ps cleanly") {
  for (int sig : {SIGTERM, SIGINT}) {
    PsCluster cluster({.ps = 1});
    auto& ps = cluster.start_ps(0);
    PsClient c(cluster.config(), 0, small_map(cluster.config()));
    c.hello();  // it is serving
    ps.kill(sig);
    CHECK(ps.wait_for(5s) == 0);
  }
}

TEST_CASE("ps: heartbeats count global samples over all senders") {
  PsCluster cluster({.ps = 2, .workers = 2});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config)), w1(config, 1, small_map(config));
  CHECK(w0.heartbeat(64) == 64);
  CHECK(w1.heartbeat(32) == 96);
  CHECK(w0.heartbeat(0) == 96);
  CHECK(w1.stats(1).find("\"global_samples\":96") != std::string::npos);
}

TEST_CASE("ps: barrier releases everyone once count distinct senders entered") {
  PsCluster cluster({.ps = 1, .workers = 3});
  cluster.start_ps(0);
  const auto& config = cluster.config();
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      PsClient c(config, w, small_map(config));
      c.barrier("start", 3);
      ++released;
    });
  std::this_thread::sleep_for(300ms);
  CHECK(released == 0);  // two of three are waiting
  PsClient last(config, 2, small_map(config));
  last.barrier("start", 3);
  for (auto& t : threads) t.join();
  CHECK(released == 2);
  // A name can be used again once released; a different count is refused.
  std::thread first([&] {
    PsClient c(config, 1, small_map(config));
    c.barrier("start", 2);
  });
  std::this_thread::sleep_for(200ms);
  PsClient other(config, 0, small_map(config));
  CHECK_THROWS_WITH_AS(other.barrier("start", 1), doctest::Contains("count 2"), PsError);
  last.barrier("start", 2);
  first.join();
}

TEST_CASE("ps: kv_get waits for kv_set without blocking other requests, or times out") {
  PsCluster cluster({.ps = 1, .workers = 2});
  cluster.start_ps(0);
  const auto& config = cluster.config();
  std::vector<std::uint8_t> got;
  std::thread waiter([&] {
    PsClient c(config, 1, small_map(config));
    got = c.kv_get("gloo/rank0", 10);
  });
  std::this_thread::sleep_for(200ms);
  PsClient setter(config, 0, small_map(config));
  setter.init(1);  // served while the kv_get is parked
  const std::vector<std::uint8_t> value{1, 2, 3, 0, 255};
  setter.kv_set("gloo/rank0", value);
  waiter.join();
  CHECK(got == value);
  CHECK(setter.kv_get("gloo/rank0", 0) == value);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(setter.kv_get("missing", 0.3), doctest::Contains("not set within"),
                       PsError);
  CHECK(std::chrono::steady_clock::now() - start >= 250ms);
}
