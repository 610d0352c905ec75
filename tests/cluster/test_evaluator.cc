// Worker 0's evaluator against real ps's that do not have the weights yet
// (no worker has sent init, so every pull gets an error reply): a periodic
// evaluation is skipped rather than ending worker 0, and the final one tries
// again until the weights are there, or fails after net.worker_timeout.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <future>

#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/ps/heartbeat.h"
#include "client/ps/ps_client.h"
#include "client/train/evaluator.h"
#include "tests/support/ps_cluster.h"

using namespace pstrain;
using namespace pstrain::testing;
using namespace std::chrono_literals;

namespace {

// Not a worker, as worker 0's evaluator (client/train/worker_role.cc).
constexpr std::uint32_t kEvaluatorSender = 1u << 16;

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("evaluator: a failed periodic evaluation is skipped; the final one tries again") {
  PsCluster cluster({.ps = 2, .workers = 1});
  cluster.start_all();
  const auto& config = cluster.config();
  const auto metrics_path = cluster.dir() / "eval.metrics.jsonl";
  MetricsFile metrics(metrics_path);
  Evaluator evaluator(config, kEvaluatorSender, load_dataset(config.data, false), metrics);

  evaluator.request(100);  // its pulls fail: nothing is initialized yet
  // evaluate_now waits for that one, then keeps trying until the weights
  // are there.
  auto final_eval = std::async(std::launch::async, [&] { return evaluator.evaluate_now(200); });
  CHECK(final_eval.wait_for(1500ms) == std::future_status::timeout);
  PsClient worker(config, 0, shard_map_for(config, evaluator.model().variables()));
  worker.hello();
  worker.init(1);
  REQUIRE(final_eval.wait_for(30s) == std::future_status::ready);
  const EvalPoint point = final_eval.get();
  CHECK(point.global_samples == 200);
  CHECK(point.accuracy >= 0);
  CHECK_NOTHROW(evaluator.latest());
  // Only the final evaluation wrote a line; the skipped one none.
  const std::string lines = read_text(metrics_path);
  CHECK_MESSAGE(lines.find("\"global_samples\":200") != std::string::npos, lines);
  CHECK_MESSAGE(lines.find("\"global_samples\":100") == std::string::npos, lines);
}

TEST_CASE("evaluator: the final evaluation fails after net.worker_timeout of failed pulls") {
  PsCluster cluster({.ps = 1, .workers = 1, .worker_timeout = 2.0});
  cluster.start_all();
  const auto& config = cluster.config();
  const HeartbeatThread heartbeats(config, 0);  // worker 0 is live: the ps stays
  MetricsFile metrics(cluster.dir() / "eval.metrics.jsonl");
  Evaluator evaluator(config, kEvaluatorSender, load_dataset(config.data, false), metrics);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(evaluator.evaluate_now(5), doctest::Contains("unknown chunk"), PsError);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 2s);
  CHECK(took < 8s);
  CHECK(cluster.ps(0).wait_for(0s) == std::nullopt);
}
