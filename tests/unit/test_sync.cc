// Sync mode in one process: two replicas on threads, each with its own CPU
// backend, model and Gloo communicator (rendezvous through an in-memory
// store), against each other and against one worker on the union batch; the
// learning-rate schedule; recorded steps (the CUDA graph path, on the
// staging backend); and a peer that goes away mid-run.
#include <doctest/doctest.h>

#include <gloo/rendezvous/hash_store.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "client/comm/gloo_communicator.h"
#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/train/local_sgd_replica.h"
#include "client/train/loss_scaler.h"
#include "client/train/replica_step.h"
#include "client/train/sync_replica.h"
#include "tests/support/staging_backend.h"

namespace pstrain {
namespace {

constexpr int kBatch = 32;

GlooOptions two_workers(int rank) {
  GlooOptions options;
  options.rank = rank;
  options.hosts = {"127.0.0.1", "127.0.0.1"};
  options.timeout = std::chrono::seconds(5);
  options.roll_call = std::chrono::milliseconds(300);
  return options;
}

// FNV-1a over every weight's bytes.
std::uint64_t weights_hash(Model& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < model.variables().size(); ++i) {
    const auto* p = model.param(i).data<unsigned char>();
    for (std::size_t k = 0; k < model.param(i).bytes(); ++k) h = (h ^ p[k]) * 1099511628211ull;
  }
  return h;
}

std::vector<float> weights(Model& model) {
  std::vector<float> all;
  for (std::size_t i = 0; i < model.variables().size(); ++i) {
    const float* p = model.param(i).data();
    all.insert(all.end(), p, p + model.variables()[i].size);
  }
  return all;
}

ModelConfig mlp() {
  ModelConfig config;
  config.preset = "mlp";
  return config;
}

// A recording staging backend (its step graphs run the work eagerly), for
// the trainers' CUDA graph path.
std::unique_ptr<Backend> recording_backend() {
  auto staging = std::make_unique<testing::StagingBackend>();
  staging->record_steps(testing::StagingBackend::Recording::on);
  return staging;
}

OptimizerConfig optimizer(OptimizerKind kind, float lr) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = lr;
  return c;
}

// One sync worker on a thread: `body` gets its replica, model and shard.
// `on`: the CPU; a staging backend the host cannot reach, so the replica
// takes the device path (collectives issued as buckets fill, as with NCCL);
// or one that also records steps of kBatch (the CUDA graph path).
enum class On { cpu, staging, recording };
struct Worker {
  Worker(int rank, const Dataset& data, std::shared_ptr<gloo::rendezvous::Store> store,
         const OptimizerConfig& optimizer, std::size_t bucket_bytes, bool overlap,
         std::uint32_t local_steps, std::uint32_t accumulate_steps, On on)
      : backend(on == On::recording ? recording_backend()
                : on == On::staging ? std::make_unique<testing::StagingBackend>()
                                    : make_cpu_backend(1)),
        shard(data, static_cast<std::uint32_t>(rank), 2, 7),
        model(mlp(), *backend, InputShape{data.channels, data.height, data.width}, data.classes,
              kBatch) {
    model.initialize(42);
    comm = std::make_unique<GlooCommunicator>(two_workers(rank), std::move(store));
    const int record = on == On::recording ? kBatch : 0;
    if (local_steps > 0)
      replica = std::make_unique<LocalSgdReplica>(*backend, model, *comm, optimizer, local_steps,
                                                  accumulate_steps, record);
    else
      replica = std::make_unique<SyncReplica>(*backend, model, *comm, optimizer, bucket_bytes,
                                              overlap, accumulate_steps, record);
  }
  int step(float lr_scale = 1) {
    const Batch b = shard.next_batch(kBatch, model.input_buffer(), model.label_buffer());
    replica->step(static_cast<int>(b.size), lr_scale);
    return static_cast<int>(b.size);
  }
  std::unique_ptr<Backend> backend;
  WorkerShard shard;
  Model model;
  std::unique_ptr<GlooCommunicator> comm;
  std::unique_ptr<Replica> replica;
};

// Builds both workers concurrently (the mesh needs both) and runs
// body(worker) on each, on its own thread. `local_steps`: local SGD's H
// (0: sync); `accumulate_steps`: train.accumulate_steps; `on`: see Worker.
void run_pair(const Dataset& data, const OptimizerConfig& optimizer, std::size_t bucket_bytes,
              bool overlap, const std::function<void(Worker&)>& body, std::uint32_t local_steps = 0,
              std::uint32_t accumulate_steps = 1, On on = On::cpu) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto run = [&](int rank) {
    Worker w(rank, data, store, optimizer, bucket_bytes, overlap, local_steps, accumulate_steps,
             on);
    body(w);
  };
  auto other = std::async(std::launch::async, run, 1);
  run(0);
  other.get();
}

TEST_CASE("sync: replicas stay bit-identical after every step, for every bucketing") {
  const Dataset data = make_synthetic(512, true);
  const OptimizerConfig adam = optimizer(OptimizerKind::adam, 0.01f);
  for (const auto& [bucket_bytes, overlap] :
       {std::pair<std::size_t, bool>{4, true}, {64 * 1024, true}, {1 << 30, false}}) {
    CAPTURE(bucket_bytes);
    CAPTURE(overlap);
    std::array<std::vector<std::uint64_t>, 2> hashes;
    std::array<std::size_t, 2> buckets{};
    run_pair(data, adam, bucket_bytes, overlap, [&](Worker& w) {
      buckets[static_cast<std::size_t>(w.comm->rank())] =
          dynamic_cast<SyncReplica&>(*w.replica).buckets();
      for (int s = 0; s < 6; ++s) {
        w.step();
        hashes[static_cast<std::size_t>(w.comm->rank())].push_back(weights_hash(w.model));
      }
    });
    CHECK(hashes[0] == hashes[1]);
    // The weights moved at every step, so equal hashes are not trivially equal.
    for (std::size_t s = 1; s < hashes[0].size(); ++s) CHECK(hashes[0][s] != hashes[0][s - 1]);
    // The MLP's 6 variables: one bucket each at 4 bytes; 64 KiB closes a
    // bucket after dense1/w (128 KiB); no limit puts everything in one.
    const std::size_t expected = bucket_bytes == 4 ? 6 : bucket_bytes == 64 * 1024 ? 2 : 1;
    CHECK(buckets[0] == expected);
    CHECK(buckets[1] == expected);
  }
}

TEST_CASE(
    "sync and local SGD: recorded steps (the CUDA graph path) give the eager steps' weights") {
  // Adam with a learning-rate scale that changes every step: the optimizer
  // step's graph must be run with each step's count and scale. The warm-up
  // and each epoch's last batch (250 samples per worker: 7 of kBatch and
  // one of 26) run eagerly, the rest from the graphs.
  const Dataset data = make_synthetic(500, true);
  const OptimizerConfig adam = optimizer(OptimizerKind::adam, 0.01f);
  for (const std::uint32_t local_steps : {0u, 2u}) {
    CAPTURE(local_steps);
    std::array<std::vector<std::vector<float>>, 2> runs;  // eager, recorded: rank 0's weights
    for (const bool recorded : {false, true}) {
      run_pair(
          data, adam, 4, false,
          [&](Worker& w) {
            for (int s = 1; s <= 10; ++s) {
              w.step(1.0f / static_cast<float>(s));
              if (w.comm->rank() == 0) runs[recorded].push_back(weights(w.model));
            }
          },
          local_steps, 1, recorded ? On::recording : On::cpu);
    }
    REQUIRE(runs[0].size() == runs[1].size());
    for (std::size_t s = 0; s < runs[0].size(); ++s) {
      CAPTURE(s);
      CHECK(runs[0][s] == runs[1][s]);
    }
  }
}

TEST_CASE("sync: gradient buckets fill from the last variable down to at least bucket_bytes") {
  const auto plan = [](std::vector<std::uint64_t> sizes, std::size_t bucket_bytes) {
    std::vector<VariableSpec> vars;
    for (std::uint64_t n : sizes) vars.push_back({"v", n, {}});
    std::vector<std::array<std::size_t, 3>> out;
    for (const GradientBucket& b : gradient_buckets(vars, bucket_bytes))
      out.push_back({b.first_variable, b.last_variable, b.count});
    return out;
  };
  using Plan = std::vector<std::array<std::size_t, 3>>;
  // 16 bytes: 5 floats close a bucket alone, so does 1000; 3 floats take
  // the next variable too.
  CHECK(plan({10, 3, 1000, 5}, 16) == Plan{{3, 3, 5}, {2, 2, 1000}, {0, 1, 13}});
  CHECK(plan({10, 3, 1000, 5}, 1 << 30) == Plan{{0, 3, 1018}});
  CHECK(plan({10, 3, 1000, 5}, 1) == Plan{{3, 3, 5}, {2, 2, 1000}, {1, 1, 3}, {0, 0, 10}});
  CHECK(plan({4, 4}, 16) == Plan{{1, 1, 4}, {0, 0, 4}});  // exactly full closes
  CHECK(plan({}, 16).empty());
}

// The device path (gradients copied into the buckets by the backend, each
// all-reduced as soon as it is full, during backward) against the host
// path, for every bucketing: the same sums, so the same bits.
TEST_CASE("sync: replicas on a backend the host cannot reach step exactly as on the CPU") {
  const Dataset data = make_synthetic(512, true);
  const OptimizerConfig adam = optimizer(OptimizerKind::adam, 0.01f);
  for (std::size_t bucket_bytes : {std::size_t{4}, std::size_t{64 * 1024}, std::size_t{1} << 30}) {
    CAPTURE(bucket_bytes);
    std::array<std::vector<float>, 2> cpu, staging;
    std::mutex mutex;
    for (bool on_staging : {false, true}) {
      run_pair(
          data, adam, bucket_bytes, true,
          [&](Worker& w) {
            for (int s = 0; s < 3; ++s) w.step();
            std::lock_guard lock(mutex);
            (on_staging ? staging : cpu)[static_cast<std::size_t>(w.comm->rank())] =
                weights(w.model);
          },
          0, 1, on_staging ? On::staging : On::cpu);
    }
    CHECK(cpu[0] == cpu[1]);
    CHECK(staging[0] == cpu[0]);
    CHECK(staging[1] == cpu[1]);
  }
}

TEST_CASE("sync: one step equals one worker's step on both batches with the averaged gradient") {
  const Dataset data = make_synthetic(256, true);
  const OptimizerConfig sgd = optimizer(OptimizerKind::sgd, 0.5f);
  std::vector<float> replica;
  run_pair(data, sgd, 64 * 1024, true, [&](Worker& w) {
    w.step();
    if (w.comm->rank() == 0) replica = weights(w.model);
  });

  // The same first batches, side by side in one batch of 2 x kBatch: the
  // mean loss over both has the average of the two gradients.
  auto backend = make_cpu_backend(1);
  Model single(mlp(), *backend, InputShape{data.channels, data.height, data.width}, data.classes,
               2 * kBatch);
  single.initialize(42);
  const std::vector<float> before = weights(single);
  for (std::uint32_t r = 0; r < 2; ++r) {
    WorkerShard shard(data, r, 2, 7);
    shard.next_batch(kBatch, single.input_buffer() + r * kBatch * data.sample_floats(),
                     single.label_buffer() + r * kBatch);
  }
  single.forward_backward(2 * kBatch, [](std::size_t) {});
  const Optimizer optimizer(sgd);
  for (std::size_t i = 0; i < single.variables().size(); ++i) {
    const std::size_t n = single.variables()[i].size;
    optimizer.apply({single.param(i).data(), n}, {single.grad(i).data(), n}, {}, 1);
  }
  const std::vector<float> expected = weights(single);

  REQUIRE(replica.size() == expected.size());
  std::size_t moved = 0, mismatched = 0;
  for (std::size_t k = 0; k < expected.size(); ++k) {
    moved += expected[k] != before[k];
    if (std::abs(replica[k] - expected[k]) > 1e-5f + 1e-4f * std::abs(expected[k])) ++mismatched;
  }
  CHECK(moved > expected.size() / 2);
  CHECK(mismatched == 0);
}

TEST_CASE("sync: 2 accumulated micro-batches per worker equal one step on all 4 batches") {
  const Dataset data = make_synthetic(256, true);
  const OptimizerConfig sgd = optimizer(OptimizerKind::sgd, 0.5f);
  // Each worker's first two batches, side by side in one batch of 4 x kBatch.
  auto backend = make_cpu_backend(1);
  Model single(mlp(), *backend, InputShape{data.channels, data.height, data.width}, data.classes,
               4 * kBatch);
  single.initialize(42);
  for (std::uint32_t r = 0; r < 2; ++r) {
    WorkerShard shard(data, r, 2, 7);
    for (std::uint32_t j = 0; j < 2; ++j) {
      const std::size_t at = (2 * r + j) * kBatch;
      shard.next_batch(kBatch, single.input_buffer() + at * data.sample_floats(),
                       single.label_buffer() + at);
    }
  }
  single.forward_backward(4 * kBatch, [](std::size_t) {});
  const Optimizer optimizer(sgd);
  for (std::size_t i = 0; i < single.variables().size(); ++i) {
    const std::size_t n = single.variables()[i].size;
    optimizer.apply({single.param(i).data(), n}, {single.grad(i).data(), n}, {}, 1);
  }
  const std::vector<float> expected = weights(single);

  for (const bool overlap : {true, false}) {
    INFO("overlap ", overlap);
    std::vector<float> replica;
    run_pair(
        data, sgd, 64 * 1024, overlap,
        [&](Worker& w) {
          const Batch first =
              w.shard.next_batch(kBatch, w.model.input_buffer(), w.model.label_buffer());
          w.replica->accumulate(static_cast<int>(first.size));
          w.step();
          if (w.comm->rank() == 0) replica = weights(w.model);
        },
        0, 2);
    REQUIRE(replica.size() == expected.size());
    std::size_t mismatched = 0;
    for (std::size_t k = 0; k < expected.size(); ++k)
      if (std::abs(replica[k] - expected[k]) > 1e-5f + 1e-4f * std::abs(expected[k])) ++mismatched;
    CHECK(mismatched == 0);
  }
}

TEST_CASE(
    "sync fp16 loss scaling: the scale is divided out; an overflow skips the step everywhere") {
  // The scaler works on any backend; fp16 GEMMs only make overflows likely.
  // A power-of-two scale is exact, so the step equals the unscaled one; a
  // scale beyond float's range makes every gradient non-finite.
  const Dataset data = make_synthetic(256, true);
  const OptimizerConfig sgd = optimizer(OptimizerKind::sgd, 0.5f);
  std::mutex mutex;
  std::vector<std::vector<float>> unscaled(2), scaled(2), before(2), overflowed(2);
  std::vector<std::uint64_t> skipped(2);
  run_pair(data, sgd, 64 * 1024, true, [&](Worker& w) {
    w.step();
    std::lock_guard lock(mutex);
    unscaled[w.comm->rank()] = weights(w.model);
  });
  run_pair(data, sgd, 64 * 1024, true, [&](Worker& w) {
    MetricsRegistry registry;
    LossScaler scaler(registry, {.initial = 1024});
    w.replica->scale_loss(&scaler);
    w.step();
    std::lock_guard lock(mutex);
    scaled[w.comm->rank()] = weights(w.model);
  });
  run_pair(data, sgd, 64 * 1024, true, [&](Worker& w) {
    MetricsRegistry registry;
    LossScaler scaler(registry, {.initial = std::numeric_limits<double>::max()});
    w.replica->scale_loss(&scaler);
    const std::vector<float> start = weights(w.model);
    w.step();
    std::lock_guard lock(mutex);
    before[w.comm->rank()] = start;
    overflowed[w.comm->rank()] = weights(w.model);
    skipped[w.comm->rank()] = scaler.skipped();
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r);
    REQUIRE(scaled[r].size() == unscaled[r].size());
    std::size_t mismatched = 0;
    for (std::size_t k = 0; k < scaled[r].size(); ++k)
      mismatched +=
          std::abs(scaled[r][k] - unscaled[r][k]) > 1e-6f * (1 + std::abs(unscaled[r][k]));
    CHECK(mismatched == 0);
    CHECK(unscaled[r] != before[r]);    // a step moves the weights...
    CHECK(overflowed[r] == before[r]);  // ... an overflowed one does not
    CHECK(skipped[r] == 1);
  }
}

TEST_CASE("local SGD: H = 1 equals sync's step; H = 3 replicas part, then agree at each average") {
  const Dataset data = make_synthetic(512, true);
  OptimizerConfig momentum;  // linear in the gradient, state kept per worker
  momentum.kind = OptimizerKind::momentum;
  momentum.lr = 0.1f;
  auto trained = [&](std::uint32_t local_steps) {
    std::vector<float> out;
    run_pair(
        data, momentum, 64 * 1024, true,
        [&](Worker& w) {
          for (int s = 0; s < 4; ++s) w.step();
          if (w.comm->rank() == 0) out = weights(w.model);
        },
        local_steps);
    return out;
  };
  const auto sync = trained(0), local = trained(1);
  REQUIRE(sync.size() == local.size());
  std::size_t mismatched = 0;
  for (std::size_t k = 0; k < sync.size(); ++k)
    mismatched += std::abs(local[k] - sync[k]) > 1e-6f + 1e-5f * std::abs(sync[k]);
  CHECK(mismatched == 0);

  std::array<std::vector<std::uint64_t>, 2> hashes;
  run_pair(
      data, momentum, 64 * 1024, true,
      [&](Worker& w) {
        for (int s = 0; s < 6; ++s) {
          w.step();
          hashes[static_cast<std::size_t>(w.comm->rank())].push_back(weights_hash(w.model));
        }
      },
      3);
  for (std::size_t s = 0; s < 6; ++s) {
    CAPTURE(s);
    // Steps 3 and 6 end on an average: every replica the same bits.
    CHECK((hashes[0][s] == hashes[1][s]) == (s % 3 == 2));
  }
}

TEST_CASE("sync: the learning-rate factor warms up linearly to the scaled rate") {
  TrainConfig t;
  CHECK(sync_lr_scale(t, 4, 1) == 1.0f);
  t.lr_scaling = true;
  CHECK(sync_lr_scale(t, 4, 1) == 4.0f);
  t.warmup_steps = 10;
  CHECK(sync_lr_scale(t, 4, 0) == doctest::Approx(1.0));
  CHECK(sync_lr_scale(t, 4, 5) == doctest::Approx(2.5));
  CHECK(sync_lr_scale(t, 4, 10) == 4.0f);
  CHECK(sync_lr_scale(t, 4, 1000) == 4.0f);
  t.lr_scaling = false;
  CHECK(sync_lr_scale(t, 4, 5) == doctest::Approx(0.5));
  CHECK(sync_lr_scale(t, 4, 10) == 1.0f);
  // Accumulation makes the effective batch, and the scaled rate, 3 x larger.
  t.accumulate_steps = 3;
  CHECK(sync_lr_scale(t, 4, 10) == 1.0f);
  t.lr_scaling = true;
  CHECK(sync_lr_scale(t, 4, 10) == 12.0f);
  CHECK(sync_lr_scale(t, 4, 5) == doctest::Approx(6.5));
}

TEST_CASE("sync: a peer that goes away is named in the error, and the communicator stays broken") {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<float> data(1000, 1.0f);
  auto peer = std::async(std::launch::async, [&] {
    GlooCommunicator comm(two_workers(1), store);
    std::vector<float> mine(1000, 2.0f);
    comm.allreduce_sum(mine.data(), mine.size());
    return mine[0];
  });
  GlooCommunicator comm(two_workers(0), store);
  comm.allreduce_sum(data.data(), data.size());
  CHECK(data[0] == 3.0f);
  CHECK(peer.get() == 3.0f);  // worker 1 has returned and closed its sockets

  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    comm.allreduce_sum(data.data(), data.size());
  } catch (const CommError& e) {
    message = e.what();
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(message.find("worker 1 (127.0.0.1) did not answer within 5 s") != std::string::npos);
  CHECK_THROWS_WITH_AS(comm.barrier(), message.c_str(), CommError);
}

}  // namespace
}  // namespace pstrain
