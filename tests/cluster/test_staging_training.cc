// The asynchronous trainer's device path (pinned staging buffers, gradient
// downloads pushed as their fences complete, weight uploads, batches staged a
// step ahead) run on the CPU through a backend that hides its memory from the
// host: one worker against one ps must end with weights bit-identical to the
// direct CPU path's, with and without recorded steps (a CUDA graph's path).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/backend_setup.h"
#include "client/train/trainer.h"
#include "shared/init.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/staging_backend.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

// One worker of a two-ps cluster, ready to train on `backend`.
struct Worker {
  explicit Worker(Backend& backend)
      : data(load_dataset(config.data, true)),
        shard(data, 0, 1, config.train.seed),
        model(config.model, backend, {1, 28, 28}, 10, static_cast<int>(config.train.batch_size)),
        ps(config, 0, shard_map_for(config, model.variables())),
        metrics(cluster.dir() / "worker0.metrics.jsonl"),
        context{config, 0, backend, model, ps, shard, metrics, registry, {}} {
    cluster.start_all();
    ps.hello();
    ps.init(config.train.seed);
  }
  std::vector<std::vector<float>> pull() {
    std::vector<std::vector<float>> weights;
    for (const auto& v : model.variables()) {
      weights.emplace_back(v.size);
      ps.wait(ps.pull(v.name, weights.back()));
    }
    return weights;
  }

  PsCluster cluster{{.ps = 2, .workers = 1, .optimizer = "momentum", .lr = 0.02}};
  const ClusterConfig& config = cluster.config();
  Dataset data;
  WorkerShard shard;
  Model model;
  PsClient ps;
  MetricsFile metrics;
  MetricsRegistry registry;
  TrainContext context;
};

std::vector<std::vector<float>> train_and_pull(Backend& backend) {
  Worker worker(backend);
  const TrainSummary summary = train(worker.context);
  CHECK(summary.local_samples == worker.data.size());
  return worker.pull();
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

TEST_CASE(
    "async trainer: pushes after the whole backward (recorded steps) give the weights of per-layer "
    "pushes") {
  // Forward and backward from a step graph, the gradients downloaded and
  // pushed after it, not each as backward makes it as on the direct path
  // (one worker, no pipelining: the overlap must not change a bit); and,
  // where the capture is refused, the eager fallback: both end with the
  // direct path's weights, and the graph path really ran.
  auto cpu = make_cpu_backend(1);
  const auto direct = train_and_pull(*cpu);
  for (const auto recording : {StagingBackend::Recording::on, StagingBackend::Recording::refused}) {
    INFO("recording ", static_cast<int>(recording));
    StagingBackend staging;
    staging.record_steps(recording);
    const auto recorded = train_and_pull(staging);
    if (recording == StagingBackend::Recording::on)
      CHECK(staging.graph_runs() > 0);
    else
      CHECK(staging.graph_runs() == 0);
    REQUIRE(direct.size() == recorded.size());
    for (std::size_t i = 0; i < direct.size(); ++i) {
      INFO("variable ", i);
      CHECK(direct[i] == recorded[i]);
    }
  }
}

TEST_CASE("async trainer: the worker's metrics say which backend paths ran, graphs included") {
  // A trainer that asked for recorded steps must show them recorded once and
  // replayed after, and every path the backend counted must reach the
  // registry (what /metrics serves) with its count.
  StagingBackend staging;
  staging.record_steps(StagingBackend::Recording::on);
  Worker worker(staging);
  const TrainSummary summary = train(worker.context);
  const PathCounts paths = staging.path_counts();
  INFO(describe_paths(paths));
  CHECK(paths.count("step_graph recorded") == 1);
  CHECK(paths.at("step_graph recorded") == 1);
  // Full batches after the warm-up and the recording one are replayed (an
  // epoch's short last batch runs eagerly).
  CHECK(paths.at("step_graph replayed") > 0);
  CHECK(paths.at("step_graph replayed") <= summary.steps - 2);
  CHECK(paths.count("dense onednn") + paths.count("dense gemm") == 1);
  const std::string text = worker.registry.prometheus_text();
  for (const auto& [key, count] : paths) {
    const auto space = key.find(' ');
    const std::string series = "pstrain_worker_backend_ops_total{op=\"" + key.substr(0, space) +
                               "\",path=\"" + key.substr(space + 1) + "\"} " +
                               std::to_string(count) + "\n";
    INFO(series);
    CHECK(text.find(series) != std::string::npos);
  }
}

TEST_CASE("async trainer: a failed fence wait leaves no ps request writing into freed buffers") {
  // The first step's gradients are pushed as their fences complete; the
  // second wait() for one of them fails while the pushes before it await
  // their replies, which are written into pinned staging buffers the
  // unwinding frees.
  StagingBackend staging;
  Worker worker(staging);
  staging.fail_wait(1);
  CHECK_THROWS_WITH_AS(train(worker.context), "staging backend: injected failure of wait()",
                       std::runtime_error);
  // Whatever the trainer left in flight goes on now: a gradient sent (or
  // resent) from a freed buffer holds its 0xff fill, NaNs the ps refuses, and
  // a reply lands in a freed weights buffer.
  CHECK_NOTHROW(worker.ps.wait_all());
  CHECK_FALSE(staging.host_written_after_release());
}
