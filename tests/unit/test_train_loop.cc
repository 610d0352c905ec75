// The training loop's batch feeder on a backend the host cannot reach: the
// staged (double-buffered, gathered one step ahead) batches must be exactly
// the batches the host writes directly on the CPU backend.
#include <doctest/doctest.h>

#include <cstring>

#include "client/cpu_backend.h"
#include "client/dataset.h"
#include "client/model.h"
#include "client/train_loop.h"
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
