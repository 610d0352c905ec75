// A real `pstrain --role ps`: when it exits (all workers done, silent
// workers, signals) and its control operations (barrier, key-value
// rendezvous, heartbeats with global sample counts).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <future>
#include <thread>

#include "client/ps/ps_client.h"
#include "tests/support/ps_cluster.h"

using namespace pstrain;
using namespace pstrain::testing;
using namespace std::chrono_literals;

namespace {

ShardMap small_map(const ClusterConfig& c) { return shard_map_for(c, {{"w", 8, {}}}); }

// Polls ps 0's stats until `key` (parked_barrier, parked_kv_get) equals
// `value`: the requests a test started on other threads have arrived and
// are parked. Asks as a tool (not a worker), so liveness is not touched.
// False after 10 s; the test goes on, so its threads can still be joined.
bool parked(const ClusterConfig& config, const std::string& key, int value) {
  PsClient tool(config, 1000, small_map(config));
  const std::string want = "\"" + key + "\":" + std::to_string(value) + ",";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::string stats;
  while ((stats = tool.stats(0)).find(want) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline) {
      MESSAGE("never " << want << " in " << stats);
      return false;
    }
    std::this_thread::sleep_for(10ms);
  }
  return true;
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
  // Worker 1 is still running, so both ps's still serve.
  for (std::uint32_t s = 0; s < 2; ++s)
    CHECK(w0.stats(s).find("\"done\":1,\"progress\":") != std::string::npos);
  w1.done(200);
  for (std::uint32_t s = 0; s < 2; ++s) {
    CHECK(cluster.ps(s).wait_for(10s) == 0);
    CHECK(cluster.ps(s).log_text().find("all 2 workers done") != std::string::npos);
  }
}

TEST_CASE("ps: on_worker_loss fail: a silent worker makes the ps exit 3 naming it") {
  PsCluster cluster({.ps = 1, .workers = 2, .worker_timeout = 1.0, .on_worker_loss = "fail"});
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
      w0.heartbeat();
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

namespace {

// Worker `w` heartbeats every 100 ms for `how_long`: past a worker_timeout
// of 1 s, so its silent peers are given up on while it stays live.
void keep_talking(PsClient& w, std::chrono::milliseconds how_long) {
  const auto until = std::chrono::steady_clock::now() + how_long;
  while (std::chrono::steady_clock::now() < until) {
    w.heartbeat();
    std::this_thread::sleep_for(100ms);
  }
}

}  // namespace

TEST_CASE("ps: on_worker_loss continue: a silent worker is absent, the ps exits 0 after the rest") {
  PsCluster cluster({.ps = 2, .workers = 2, .worker_timeout = 1.0, .on_worker_loss = "continue"});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config));
  w0.hello();
  // Worker 1 never shows up; worker 0 keeps talking past the timeout.
  keep_talking(w0, 2500ms);
  for (std::uint32_t s = 0; s < 2; ++s) {
    CHECK_FALSE(cluster.ps(s).wait_for(0s).has_value());
    CHECK(cluster.ps(s).log_text().find("no message from worker(s) 1 for 1.0 s "
                                        "(net.worker_timeout); marked absent") !=
          std::string::npos);
  }
  w0.done(25);
  for (std::uint32_t s = 0; s < 2; ++s) {
    CHECK(cluster.ps(s).wait_for(10s) == 0);
    CHECK(cluster.ps(s).log_text().find("every live worker done (0), worker(s) 1 absent") !=
          std::string::npos);
  }
}

TEST_CASE("ps: a worker starting later than worker_timeout joins while the others are live") {
  PsCluster cluster({.ps = 1, .workers = 2, .worker_timeout = 1.0});
  auto& ps = cluster.start_ps(0);
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config));
  w0.hello();
  keep_talking(w0, 2500ms);
  // Worker 1 was given up on, but comes now: it is live, the final barrier
  // waits for it, and the ps ends as after a run without loss.
  PsClient w1(config, 1, small_map(config));
  w1.hello();
  auto barrier0 = std::async(std::launch::async, [&] { w0.barrier("train-done", 2); });
  CHECK(parked(config, "parked_barrier", 1));
  for (int i = 0; i < 15; ++i) {  // longer than worker_timeout: the barrier waits for worker 1
    w1.heartbeat();
    std::this_thread::sleep_for(100ms);
  }
  CHECK(parked(config, "parked_barrier", 1));
  w1.barrier("train-done", 2);
  barrier0.get();
  w0.done(25);
  w1.done(1);
  CHECK(ps.wait_for(10s) == 0);
  const std::string log = ps.log_text();
  CHECK_MESSAGE(log.find("worker 1 is back; it is live again") != std::string::npos, log);
  CHECK_MESSAGE(log.find("all 2 workers done") != std::string::npos, log);
}

TEST_CASE("ps: a ps that no worker ever contacts exits 3 after worker_timeout") {
  PsCluster cluster({.ps = 1, .workers = 2, .worker_timeout = 1.0});
  const auto start = std::chrono::steady_clock::now();
  auto& ps = cluster.start_ps(0);
  const auto code = ps.wait_for(10s);
  REQUIRE_MESSAGE(code.has_value(), ps.log_text());
  CHECK(*code == 3);
  CHECK(std::chrono::steady_clock::now() - start >= 900ms);
  CHECK_MESSAGE(
      ps.log_text().find("every worker is lost: worker(s) 0, 1 absent") != std::string::npos,
      ps.log_text());
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

TEST_CASE("ps: progress reports count global samples over all senders") {
  PsCluster cluster({.ps = 2, .workers = 2});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config)), w1(config, 1, small_map(config));
  CHECK(w0.report_progress(64, {0, 1}) == 64);
  CHECK(w1.report_progress(32, {0, 1}) == 96);
  CHECK(w0.report_progress(0) == 96);
  CHECK(w0.heartbeat() == 96);
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
  CHECK(parked(config, "parked_barrier", 2));
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
  CHECK(parked(config, "parked_barrier", 1));
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
    got = c.kv_get(0, "gloo/rank0", 10);
  });
  CHECK(parked(config, "parked_kv_get", 1));
  PsClient setter(config, 0, small_map(config));
  setter.init(1);  // served while the kv_get is parked
  const std::vector<std::uint8_t> value{1, 2, 3, 0, 255};
  setter.kv_set("gloo/rank0", value);
  waiter.join();
  CHECK(got == value);
  CHECK(setter.kv_get(0, "gloo/rank0", 0) == value);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(setter.kv_get(0, "missing", 0.3), doctest::Contains("not set within"),
                       PsError);
  CHECK(std::chrono::steady_clock::now() - start >= 250ms);
}
