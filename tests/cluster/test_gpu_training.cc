// The trainers on a GPU for real: the asynchronous and the synchronous
// trainer train the MLP and the CNN through the CUDA backend (pinned staging
// buffers, fences, gradient downloads, NCCL with one rank) against one ps,
// and must end where the same run on the CPU backend ends, to float
// tolerance (cuBLAS and OpenBLAS sum in other orders). The runs are short
// enough that rounding differences stay far below how far training moved
// the weights, which the test checks too, so a trainer that skipped a fence,
// pushed a stale gradient or dropped an update fails. Steps replayed from
// CUDA graphs (train.cuda_graphs, the default) must end bit for bit where
// eager steps end: the same kernels on the same data. The click-through
// presets' forward and backward on the GPU match the double reference.
// Exits 77 (skipped) where the CUDA library or a device is missing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/compute/cuda_loader.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/backend_setup.h"
#include "client/train/trainer.h"
#include "shared/init.h"
#include "tests/support/ctr_reference.h"
#include "tests/support/gpu_exit.h"
#include "tests/support/ps_cluster.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

using Weights = std::vector<std::vector<float>>;

struct Run {
  Weights initial, final;
  PathCounts paths;     // what the backend's ops took during the run
  std::string metrics;  // the worker's registry, in Prometheus text
};

// How often each path ran between two path_counts().
PathCounts ran_between(const PathCounts& before, const PathCounts& after) {
  PathCounts ran;
  for (const auto& [path, count] : after) {
    const auto was = before.find(path);
    const std::uint64_t delta = count - (was == before.end() ? 0 : was->second);
    if (delta > 0) ran[path] = delta;
  }
  return ran;
}

// One worker against one ps, `mode` (async or sync) and `preset` (mlp or
// cnn), a quarter epoch of the synthetic data (24 steps of 64); `graphs`:
// train.cuda_graphs; `precision`: train.precision.
Run train(Backend& backend, const std::string& mode, const std::string& preset, bool graphs = true,
          Precision precision = Precision::fp32) {
  std::string train = graphs ? "cuda_graphs: true" : "cuda_graphs: false";
  train += ", precision: " + std::string(to_string(precision));
  PsCluster cluster({.ps = 1,
                     .workers = 1,
                     .optimizer = "momentum",
                     .lr = 0.02,
                     .mode = mode,
                     .model = preset,
                     .epochs = 0.25,
                     .train = train});
  cluster.start_all();
  const ClusterConfig& config = cluster.config();
  const Dataset data = load_dataset(config.data, true);
  WorkerShard shard(data, 0, 1, config.train.seed);
  // Before the model, which sizes its workspaces at the backend's precision.
  REQUIRE(apply_precision(backend, precision) == precision);
  Model model(config.model, backend, {data.channels, data.height, data.width}, data.classes,
              static_cast<int>(config.train.batch_size));
  PsClient ps(config, 0, shard_map_for(config, model.variables()));
  ps.hello();
  ps.init(config.train.seed);
  const auto pull = [&] {
    Weights weights;
    for (const auto& v : model.variables()) {
      weights.emplace_back(v.size);
      ps.wait(ps.pull(v.name, weights.back()));
    }
    return weights;
  };
  Run run{pull(), {}, {}, {}};
  MetricsFile metrics(cluster.dir() / "worker0.metrics.jsonl");
  MetricsRegistry registry;
  const TrainContext context{config, 0, backend, model, ps, shard, metrics, registry, {}};
  const PathCounts before = backend.path_counts();
  const TrainSummary summary = pstrain::train(context);
  CHECK(summary.steps == 24);
  run.final = pull();
  backend.set_precision(Precision::fp32);  // the next run's default
  run.paths = ran_between(before, backend.path_counts());
  run.metrics = registry.prometheus_text();
  return run;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

void check_gpu_matches_cpu(const std::string& mode, const std::string& preset) {
  auto cpu_backend = make_cpu_backend(1);
  auto gpu_backend = cuda::make_cuda_backend(0);
  const Run cpu = train(*cpu_backend, mode, preset);
  const Run gpu = train(*gpu_backend, mode, preset);
  REQUIRE(cpu.final.size() == gpu.final.size());
  CHECK(cpu.initial == gpu.initial);
  for (std::size_t i = 0; i < cpu.final.size(); ++i) {
    const double moved = max_diff(cpu.final[i], cpu.initial[i]);
    const double apart = max_diff(cpu.final[i], gpu.final[i]);
    INFO(mode << " " << preset << " variable " << i << ": training moved it by " << moved
              << ", the GPU run ended " << apart << " from the CPU run");
    CHECK(std::isfinite(apart));
    CHECK(apart <= 1e-3 * std::max(1.0, max_abs(cpu.final[i])));
    CHECK(apart <= 0.05 * moved);
  }
  // The fast paths ran, not their fallbacks: graphs (one for the async
  // trainer's forward and backward, and the sync trainer's optimizer step
  // too), cuBLASLt's fused dense layers, cuDNN where it is usable here.
  INFO("GPU paths: " << describe_paths(gpu.paths));
  CHECK(gpu.paths.count("step_graph recorded") == 1);
  CHECK(gpu.paths.at("step_graph recorded") == (mode == "sync" ? 2u : 1u));
  CHECK(gpu.paths.count("step_graph replayed") == 1);
  CHECK(gpu.paths.count("dense cublaslt") == 1);
  if (preset == "cnn") {
    const cuda::CudnnStatus cudnn = cuda::cudnn_status();
    INFO("cuDNN: " << cudnn.text);
    CHECK(gpu.paths.count(cudnn.usable ? "conv2d cudnn" : "conv2d im2col") == 1);
    CHECK(gpu.paths.count(cudnn.usable ? "conv2d im2col" : "conv2d cudnn") == 0);
  }
}

// The value of an unlabelled series in Prometheus text, or NaN.
double metric_value(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + name.size() + 2));
}

TEST_CASE("gpu training: async MLP ends where the CPU run ends") {
  check_gpu_matches_cpu("async", "mlp");
}

TEST_CASE("gpu training: async CNN ends where the CPU run ends") {
  check_gpu_matches_cpu("async", "cnn");
}

TEST_CASE("gpu training: sync MLP (NCCL, one rank) ends where the CPU run (Gloo) ends") {
  check_gpu_matches_cpu("sync", "mlp");
}

TEST_CASE("gpu training: sync CNN (NCCL, one rank) ends where the CPU run (Gloo) ends") {
  check_gpu_matches_cpu("sync", "cnn");
}

TEST_CASE("gpu training: steps replayed from CUDA graphs end bit for bit where eager steps end") {
  auto gpu_backend = cuda::make_cuda_backend(0);
  for (const std::string mode : {"async", "sync"}) {
    for (const std::string preset : {"mlp", "cnn"}) {
      INFO(mode << " " << preset);
      const Run eager = train(*gpu_backend, mode, preset, false);
      const Run replayed = train(*gpu_backend, mode, preset, true);
      CHECK(eager.initial == replayed.initial);
      CHECK(eager.final == replayed.final);
      CHECK(eager.final != eager.initial);
      INFO("eager: " << describe_paths(eager.paths)
                     << "; replayed: " << describe_paths(replayed.paths));
      CHECK(eager.paths.count("step_graph recorded") == 0);
      CHECK(replayed.paths.count("step_graph recorded") == 1);
      CHECK(replayed.paths.count("step_graph replayed") == 1);
    }
  }
}

TEST_CASE("gpu training: fp16 with loss scaling trains like fp32, the scaler at work") {
  // Each step's gradients are checked for overflow on the device and the
  // loss scale kept by the trainer (client/train/loss_scaler.h); the CPU has no
  // fp16 GEMMs, so only a GPU runs this path inside a trainer.
  auto gpu_backend = cuda::make_cuda_backend(0);
  for (const std::string mode : {"async", "sync"}) {
    INFO(mode);
    const Run full = train(*gpu_backend, mode, "mlp", true, Precision::fp32);
    const Run half = train(*gpu_backend, mode, "mlp", true, Precision::fp16);
    CHECK(full.initial == half.initial);
    for (std::size_t i = 0; i < full.final.size(); ++i) {
      const double moved = max_diff(full.final[i], full.initial[i]);
      const double apart = max_diff(full.final[i], half.final[i]);
      INFO("variable " << i << ": fp32 training moved it by " << moved << ", fp16 ended " << apart
                       << " from it");
      CHECK(std::isfinite(apart));
      CHECK(apart <= 0.1 * moved);
    }
    INFO(half.metrics);
    // The scale starts at 2^16 and halves on each overflow; a short run at
    // these gradients overflows rarely if ever.
    CHECK(metric_value(half.metrics, "pstrain_worker_loss_scale") >= 16384);
    CHECK(metric_value(half.metrics, "pstrain_worker_skipped_steps_total") <= 2);
    // Mixed precision runs eagerly on cuBLAS's tensor-core GEMMs.
    INFO("fp16 paths: " << describe_paths(half.paths));
    CHECK(half.paths.count("step_graph recorded") == 0);
    CHECK(half.paths.count("dense cublas") == 1);
    CHECK(half.paths.count("dense cublaslt") == 0);
  }
}

TEST_CASE("gpu: dlrm and wide_deep forward and backward match the double reference") {
  // cuBLAS sums in its own order: a looser bound than the CPU's 1e-4.
  auto backend = cuda::make_cuda_backend(0);
  ctr_reference::check_preset(*backend, ctr_reference::ctr_preset("dlrm"),
                              ctr_reference::dlrm_reference, 1e-3);
  ctr_reference::check_preset(*backend, ctr_reference::ctr_preset("wide_deep"),
                              ctr_reference::wide_deep_reference, 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (cuda::device_count() == 0) throw cuda::CudaUnavailable("0 devices");
  } catch (const cuda::CudaUnavailable& e) {
    std::printf("test_gpu_training: no CUDA device (%s): skipped\n", e.what());
    return gpu_tests_exit_status(0, 0);
  }
  doctest::Context context(argc, argv);
  return context.run();
}
