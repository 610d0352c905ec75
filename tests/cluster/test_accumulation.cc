// Gradient accumulation through the parameter servers (async mode): k
// micro-batches of b per push train like one batch of k x b per push, to
// float tolerance, and the servers receive k times fewer pushes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/trainer.h"
#include "tests/support/ps_cluster.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

struct Run {
  std::vector<float> weights;    // every variable, concatenated, as the ps holds them at the end
  std::uint64_t push_pulls = 0;  // push_pull requests the servers received
  std::uint64_t steps = 0;
};

// One worker trains one epoch of the synthetic set against two servers.
Run train(std::uint32_t batch_size, std::uint32_t accumulate_steps) {
  PsCluster cluster({.ps = 2,
                     .workers = 1,
                     .optimizer = "sgd",
                     .lr = 0.1,
                     .train = "batch_size: " + std::to_string(batch_size) +
                              ", accumulate_steps: " + std::to_string(accumulate_steps)});
  cluster.start_all();
  const ClusterConfig& config = cluster.config();
  const Dataset data = load_dataset(config.data, true);
  WorkerShard shard(data, 0, 1, config.train.seed);
  auto backend = make_cpu_backend(1);
  Model model(config.model, *backend, {1, 28, 28}, 10, static_cast<int>(batch_size));
  PsClient ps(config, 0, shard_map_for(config, model.variables()));
  ps.hello();
  ps.init(config.train.seed);
  MetricsFile metrics(cluster.dir() / "worker0.metrics.jsonl");
  MetricsRegistry registry;
  const TrainSummary summary =
      train(TrainContext{config, 0, *backend, model, ps, shard, metrics, registry, {}});
  CHECK(summary.local_samples == data.size());

  Run run;
  run.steps = summary.steps;
  for (const auto& v : model.variables()) {
    std::vector<float> w(v.size);
    ps.wait(ps.pull(v.name, w));
    run.weights.insert(run.weights.end(), w.begin(), w.end());
  }
  for (std::uint32_t s = 0; s < config.ps.size(); ++s) {
    const std::string stats = ps.stats(s);
    const std::string key = "\"push_pull\":";
    const auto at = stats.find(key);
    REQUIRE(at != std::string::npos);
    run.push_pulls += std::stoull(stats.substr(at + key.size()));
  }
  return run;
}

}  // namespace

TEST_CASE("async accumulation: 2 micro-batches of 64 per push train like batches of 128") {
  // 6000 samples: 93 batches of 64 and one of 48, 46 of 128 and one of 112,
  // the same samples in the same order; the short last group is weighted
  // by its sizes, as one batch of 112 is.
  const Run accumulated = train(64, 2);
  const Run large = train(128, 1);
  const Run small = train(64, 1);
  CHECK(accumulated.steps == 47);
  CHECK(large.steps == 47);
  CHECK(small.steps == 94);
  CHECK(accumulated.push_pulls == large.push_pulls);
  CHECK(small.push_pulls == 2 * accumulated.push_pulls);

  REQUIRE(accumulated.weights.size() == large.weights.size());
  std::size_t mismatched = 0, differ_from_small = 0;
  for (std::size_t k = 0; k < large.weights.size(); ++k) {
    const float want = large.weights[k];
    if (std::abs(accumulated.weights[k] - want) > 1e-5f + 1e-3f * std::abs(want)) ++mismatched;
    if (std::abs(small.weights[k] - want) > 1e-5f + 1e-3f * std::abs(want)) ++differ_from_small;
  }
  CHECK(mismatched == 0);
  // The tolerance still tells apart a different training: batches of 64
  // without accumulation end elsewhere.
  CHECK(differ_from_small > large.weights.size() / 10);
}
