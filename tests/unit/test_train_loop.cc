// The training loop's batch feeder on a backend the host cannot reach: the
// staged (double-buffered, gathered one step ahead) batches must be exactly
// the batches the host writes directly on the CPU backend. Gradient
// accumulation against one batch of the union, on both kinds of backend.
// Which steps run from a step graph (CUDA graphs), and when.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/train/backend_setup.h"
#include "client/train/batch_feeder.h"
#include "client/train/grad_accumulator.h"
#include "client/train/step_graphs.h"
#include "tests/support/staging_backend.h"

using namespace pstrain;

TEST_CASE("train loop: staged batches equal direct ones, step after step") {
  const Dataset data = make_synthetic(500, true);
  constexpr int kBatch = 64;  // 250 samples per shard: the last batch of an epoch is short
  ModelConfig mlp;
  auto cpu = make_cpu_backend(1);
  testing::StagingBackend staging;
  Model direct_model(mlp, *cpu, {1, 28, 28}, 10, kBatch);
  Model staged_model(mlp, staging, {1, 28, 28}, 10, kBatch);
  WorkerShard direct_shard(data, 1, 2, 5), staged_shard(data, 1, 2, 5);
  BatchFeeder direct(*cpu, direct_model, direct_shard, kBatch);
  BatchFeeder staged(staging, staged_model, staged_shard, kBatch);

  for (int step = 0; step < 12; ++step) {
    INFO("step ", step);
    const Batch a = direct.load();
    const Batch b = staged.load();
    staging.synchronize();
    REQUIRE(a.size == b.size);
    CHECK(a.epoch == b.epoch);
    CHECK(a.index == b.index);
    CHECK(std::memcmp(direct_model.input_buffer(), staged_model.input_buffer(),
                      a.size * data.sample_floats() * sizeof(float)) == 0);
    CHECK(std::memcmp(direct_model.label_buffer(), staged_model.label_buffer(),
                      a.size * sizeof(std::int32_t)) == 0);
    // Stage the next batch only on odd steps, so both paths (staged ahead
    // and gathered at load time) are exercised.
    if (step % 2) staged.stage_next();
  }
}

namespace {

// Every gradient of `model` after a backward, concatenated.
std::vector<float> gradients(Backend& backend, Model& model) {
  std::vector<float> all;
  for (std::size_t i = 0; i < model.variables().size(); ++i) {
    std::vector<float> g(model.variables()[i].size);
    backend.download(model.grad(i).data(), g.data(), g.size() * sizeof(float));
    backend.synchronize();
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

void check_accumulation(std::unique_ptr<Backend> backend) {
  const Dataset data = make_synthetic(200, true);
  constexpr int kMicro = 32;
  constexpr int kLast = 20;  // a short last micro-batch: the mean must weight by size
  constexpr int kAll = 2 * kMicro + kLast;
  ModelConfig mlp;
  Model whole(mlp, *backend, {1, 28, 28}, 10, kAll);
  Model micro(mlp, *backend, {1, 28, 28}, 10, kMicro);
  whole.initialize(3);
  micro.initialize(3);
  const std::size_t floats = data.sample_floats();
  auto put = [&](Model& m, int first, int n) {
    backend->upload(data.image(first), m.input_buffer(), n * floats * sizeof(float));
    backend->upload(data.labels.data() + first, m.label_buffer(), n * sizeof(std::int32_t));
  };
  put(whole, 0, kAll);
  whole.forward_backward(kAll, [](std::size_t) {});
  const std::vector<float> expected = gradients(*backend, whole);

  GradAccumulator accumulator(*backend, micro, 3);
  for (int step = 0; step < 2; ++step) {  // the second step must not see the first's sum
    INFO("step ", step);
    put(micro, 0, kMicro);
    accumulator.add(kMicro);
    put(micro, kMicro, kMicro);
    accumulator.add(kMicro);
    put(micro, 2 * kMicro, kLast);
    std::vector<std::size_t> issued;
    accumulator.finish(kLast, [&](std::size_t i) { issued.push_back(i); });
    CHECK(issued.size() == micro.variables().size());
    const std::vector<float> got = gradients(*backend, micro);
    REQUIRE(got.size() == expected.size());
    std::size_t mismatched = 0, nonzero = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
      nonzero += expected[k] != 0;
      if (std::abs(got[k] - expected[k]) > 1e-6f + 1e-4f * std::abs(expected[k])) ++mismatched;
    }
    CHECK(nonzero > got.size() / 2);
    CHECK(mismatched == 0);
  }
}

}  // namespace

TEST_CASE("gradient accumulation: 3 micro-batches (short last) equal one batch of all") {
  SUBCASE("cpu") { check_accumulation(make_cpu_backend(1)); }
  // The staging backend has no axpby of its own: the interface's default
  // (through host memory) is what a device backend without one runs.
  SUBCASE("staging") { check_accumulation(std::make_unique<testing::StagingBackend>()); }
}

TEST_CASE("step graphs: the full batch runs once eagerly, is recorded, then replayed") {
  testing::StagingBackend backend;
  backend.record_steps(testing::StagingBackend::Recording::on);
  std::vector<std::pair<int, std::uint64_t>> done;  // (n, step) of every run of the work
  StepGraphs graphs(backend, 64, "test step",
                    [&](int n, const StepScalars& s) { done.emplace_back(n, s.step); });
  using Ran = StepGraphs::Ran;
  CHECK(graphs.run(10, {1, 1}) == Ran::eager);  // a short batch warms nothing up
  CHECK(graphs.run(64, {2, 1}) == Ran::eager);
  CHECK(graphs.run(64, {3, 1}) == Ran::recorded);
  CHECK(graphs.run(64, {4, 1}) == Ran::replayed);
  CHECK(graphs.run(10, {5, 1}) == Ran::eager);  // an epoch's last batch
  CHECK(graphs.run(64, {6, 0.5f}) == Ran::replayed);
  CHECK(backend.graph_runs() == 3);
  const std::vector<std::pair<int, std::uint64_t>> want = {{10, 1}, {64, 2}, {64, 3},
                                                           {64, 4}, {10, 5}, {64, 6}};
  CHECK(done == want);
}

TEST_CASE("step graphs: a refused capture falls back to eager steps, none lost or doubled") {
  testing::StagingBackend backend;
  backend.record_steps(testing::StagingBackend::Recording::refused);
  int runs = 0;
  StepGraphs graphs(backend, 8, "test step", [&](int, const StepScalars&) { ++runs; });
  for (int step = 1; step <= 4; ++step) {
    CHECK(graphs.run(8, {static_cast<std::uint64_t>(step), 1}) == StepGraphs::Ran::eager);
    CHECK(runs == step);
  }
  CHECK(backend.graph_runs() == 0);
}

TEST_CASE("records_steps: train.cuda_graphs on a recording backend, at fp32, one micro-batch") {
  ClusterConfig config;
  auto cpu = make_cpu_backend(1);
  testing::StagingBackend recording;
  recording.record_steps(testing::StagingBackend::Recording::on);
  CHECK(records_steps(config, recording));
  CHECK_FALSE(records_steps(config, *cpu));  // the CPU runs every step eagerly
  config.train.cuda_graphs = false;
  CHECK_FALSE(records_steps(config, recording));
  config.train.cuda_graphs = true;
  config.train.accumulate_steps = 2;
  CHECK_FALSE(records_steps(config, recording));
  config.train.accumulate_steps = 1;
  for (const Precision p : {Precision::bf16, Precision::fp16}) {
    config.train.precision = p;
    CHECK_FALSE(records_steps(config, recording));
  }
}
