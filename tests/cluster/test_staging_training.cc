// The asynchronous trainer's device path (pinned staging buffers, gradient
// downloads pushed as their fences complete, weight uploads, batches staged a
// step ahead) run on the CPU through a backend that hides its memory from the
// host: one worker against one ps must end with weights bit-identical to the
// direct CPU path's.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "client/async_trainer.h"
#include "client/cpu_backend.h"
#include "client/dataset.h"
#include "client/model.h"
#include "client/ps_client.h"
#include "shared/init.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/staging_backend.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

std::vector<std::vector<float>> train_and_pull(Backend& backend) {
  PsCluster cluster({.ps = 2, .workers = 1, .optimizer = "momentum", .lr = 0.02});
  cluster.start_all();
  const ClusterConfig& config = cluster.config();
  const Dataset data = load_dataset(config.data, true);
  WorkerShard shard(data, 0, 1, config.train.seed);
  Model model(config.model, backend, {1, 28, 28}, 10, static_cast<int>(config.train.batch_size));
  PsClient ps(config, 0, shard_map_for(config, model.variables()));
  ps.hello();
  ps.init(config.train.seed);
  MetricsFile metrics(cluster.dir() / "worker0.metrics.jsonl");
  MetricsRegistry registry;
  const TrainSummary summary =
      train_async(TrainContext{config, 0, backend, model, ps, shard, metrics, registry, {}});
  CHECK(summary.local_samples == data.size());

  std::vector<std::vector<float>> weights;
  for (const auto& v : model.variables()) {
    weights.emplace_back(v.size);
    ps.wait(ps.pull(v.name, weights.back()));
  }
  return weights;
}

}  // namespace

TEST_CASE("async trainer: the staging (device) path trains exactly like the direct path") {
  auto cpu = make_cpu_backend(1);
  StagingBackend staging;
  const auto direct = train_and_pull(*cpu);
  const auto staged = train_and_pull(staging);
  REQUIRE(direct.size() == staged.size());
  for (std::size_t i = 0; i < direct.size(); ++i) {
    INFO("variable ", i);
    CHECK(direct[i] == staged[i]);
  }
  // And it trained: the first layer's weights moved away from their start.
  auto cpu_model_backend = make_cpu_backend(1);
  const Model model(ModelConfig{}, *cpu_model_backend, {1, 28, 28}, 10, 1);
  const auto& first = model.variables()[0];
  std::vector<float> initial(first.size);
  init_fill(initial, ClusterConfig{}.train.seed, first.name, 0, first.init);
  CHECK(direct[0] != initial);
}
