// Sync mode survives a kill -9 through the real binary: 1 ps + 3 workers
// train the MLP on the synthetic set, one worker is killed mid-run and
// started again with its own command (what tools/launch does), and the run
// completes: every process exits 0, the survivors name the new attempt and
// the steps they lost (at most train.sync_every), the restarted worker joins
// at the step the survivors resume from, and the final accuracy is as good
// as a run's without a failure.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>

#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/child_process.h"
#include "tests/support/pstrain_binary.h"

using namespace pstrain;
using namespace std::chrono_literals;

namespace {

constexpr int kWorkers = 3;
constexpr int kSyncEvery = 10;

class RestartCluster {
 public:
  RestartCluster() {
    std::ostringstream y;
    // 1,000 samples per worker in batches of 32: 32 steps an epoch, 256 in
    // all. Worker 2 sleeps 15 ms a step, which paces every worker (sync), so
    // the run lasts a few seconds and a kill lands mid-run.
    y << "job: syncrestart\nrun_dir: " << dir_.path().string() << "\nmode: sync\n"
      << "ps: [{host: 127.0.0.1, port: " << free_port() << "}]\n"
      << "workers: {count: " << kWorkers << ", host: 127.0.0.1}\nmodel: mlp\n"
      << "optimizer: {name: momentum, lr: 0.05, momentum: 0.9}\n"
      << "data: {name: synthetic, synthetic_train: 3000, synthetic_test: 500}\n"
      << "train: {batch_size: 32, epochs: 8, eval_every: 0, sync_every: " << kSyncEvery
      << ", straggler_worker: 2, straggler_delay_ms: 15}\n"
      << "net: {request_timeout: 2, worker_timeout: 15, heartbeat: 0.5}\n";
    cluster_ = dir_.path() / "cluster.yaml";
    std::ofstream(cluster_) << y.str();
  }

  void start() {
    ps_ = start_role("ps", 0, "ps0.out");
    for (int i = 0; i < kWorkers; ++i)
      workers_.push_back(start_role("worker", i, "worker" + std::to_string(i) + ".out"));
  }
  ChildProcess& ps() { return *ps_; }
  ChildProcess& worker(int i) { return *workers_.at(static_cast<std::size_t>(i)); }

  // Starts worker i again with the same command, logging to a new file.
  void restart(int i) {
    workers_.at(static_cast<std::size_t>(i)) =
        start_role("worker", i, "worker" + std::to_string(i) + ".restarted.out");
  }

  // Waits until worker i's log matches `pattern`; returns the match.
  std::smatch wait_log(int i, const std::string& pattern, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    const std::regex re(pattern);
    while (true) {
      // The match keeps iterators into `text_`, which outlives it.
      text_ = worker(i).log_text();
      std::smatch m;
      if (std::regex_search(text_, m, re)) return m;
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline,
                      "no '" << pattern << "' in worker " << i << "'s log:\n"
                             << text_);
      REQUIRE_MESSAGE(!worker(i).wait_for(20ms).has_value(), text_);
    }
  }

 private:
  std::unique_ptr<ChildProcess> start_role(const std::string& role, int index,
                                           const std::string& log) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{pstrain::testing::pstrain_binary(), "--role", role, "--index",
                                 std::to_string(index), "--cluster", cluster_.string()},
        dir_.path() / log);
  }

  TempDir dir_;
  std::filesystem::path cluster_;
  std::unique_ptr<ChildProcess> ps_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::string text_;
};

// Kills worker `victim` with SIGKILL mid-run, restarts it at once, and
// checks that the run completes as the file comment says.
void check_restart(int victim) {
  RestartCluster cluster;
  cluster.start();
  const int watcher = victim == 0 ? 1 : 0;
  // Once every worker trains, 1.5 s is about 90 of the 256 steps: past
  // several writes to the ps, far from the end.
  for (int i = 0; i < kWorkers; ++i) cluster.wait_log(i, "sync mode: gloo", 60s);
  std::this_thread::sleep_for(1500ms);
  for (int i = 0; i < kWorkers; ++i)
    REQUIRE_MESSAGE(!cluster.worker(i).wait_for(0s).has_value(), cluster.worker(i).log_text());
  cluster.worker(victim).kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  REQUIRE(cluster.worker(victim).wait_for(5s) == 128 + SIGKILL);
  cluster.restart(victim);

  // The survivors name the new attempt, where it resumes and what they lost.
  std::uint64_t resumed = 0;
  for (int i = 0; i < kWorkers; ++i) {
    if (i == victim) continue;
    const auto m = cluster.wait_log(
        i, "sync restart: attempt ([0-9]+) resumes after step ([0-9]+) .* lost ([0-9]+) steps",
        60s);
    CHECK(m[1] == "2");
    const auto step = std::stoull(m[2]);
    const auto lost = std::stoull(m[3]);
    MESSAGE("worker ", i, " resumes after step ", step, ", lost ", lost, " steps");
    CHECK(step > 0);  // the kill came after worker 0's first writes
    CHECK(step % kSyncEvery == 0);
    CHECK(lost <= static_cast<std::uint64_t>(kSyncEvery));
    if (resumed == 0) resumed = step;
    CHECK(step == resumed);
  }
  // The restarted worker sees the run under way and joins at that step.
  const auto joined = cluster.wait_log(
      victim, "the run is under way; joining attempt ([0-9]+) after step ([0-9]+)", 60s);
  CHECK(joined[1] == "2");
  CHECK(std::stoull(joined[2]) == resumed);
  cluster.wait_log(watcher, "attempt 2 starts at step", 60s);
  MESSAGE("training resumed ",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(),
          " s after the kill (restarted at once; 0.02 s polling)");

  for (int i = 0; i < kWorkers; ++i) {
    const auto code = cluster.worker(i).wait_for(120s);
    REQUIRE_MESSAGE(code.has_value(), cluster.worker(i).log_text());
    CHECK_MESSAGE(*code == 0, cluster.worker(i).log_text());
  }
  CHECK_MESSAGE(cluster.ps().wait_for(20s) == 0, cluster.ps().log_text());
  const std::string out = cluster.worker(0).log_text();
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("final test accuracy ([0-9.]+)")), out);
  const double accuracy = std::stod(m[1]);
  MESSAGE("test accuracy ", accuracy);
  CHECK(accuracy >= 0.9);
}

}  // namespace

TEST_CASE("sync restart: kill -9 of worker 1 mid-run; the run completes after its restart") {
  check_restart(1);
}

TEST_CASE("sync restart: kill -9 of worker 0 mid-run; the run completes after its restart") {
  check_restart(0);
}
