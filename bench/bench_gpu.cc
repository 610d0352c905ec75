// GPU benchmark: training-step time and samples/s of the mlp and cnn presets
// on the CUDA backend (through Model, as a worker runs them) at batch 64 to
// 1024, launched eagerly and replayed from a step graph (CUDA graph), and how
// much the backend's separate copy stream hides transfers
// behind compute. Prints tables; exits 77 where no CUDA device or library is
// available.
//
//   bench_gpu [--device N] [--steps N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/compute/cuda_loader.h"
#include "client/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One SGD training step per iteration, as sync mode runs it on a worker:
// forward, backward, optimizer on the device, then a fence the host waits on;
// issued call by call, then replayed from a step graph.
void bench_model(pstrain::Backend& backend, const std::string& preset, int steps) {
  std::printf("\n%s: training step (forward + backward + SGD), %d steps after 3 warm-up\n",
              preset.c_str(), steps);
  std::printf("%8s %12s %14s %12s %14s\n", "batch", "ms/step", "samples/s", "graph ms",
              "samples/s");
  std::mt19937 rng(1);
  for (int batch : {64, 128, 256, 512, 1024}) {
    pstrain::ModelConfig config;
    config.preset = preset;
    pstrain::Model model(config, backend, pstrain::InputShape{1, 28, 28}, 10, batch);
    model.initialize(42);
    std::vector<float> images(std::size_t(batch) * 28 * 28);
    std::vector<std::int32_t> labels(batch);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (auto& p : images) p = pixel(rng);
    for (int i = 0; i < batch; ++i) labels[i] = i % 10;
    backend.upload(images.data(), model.input_buffer(), images.size() * sizeof(float));
    backend.upload(labels.data(), model.label_buffer(), labels.size() * sizeof(std::int32_t));
    pstrain::OptimizerConfig sgd;
    sgd.lr = 0.01f;
    const pstrain::StepWork work = [&](const pstrain::StepScalars& s) {
      model.forward_backward(batch, [](std::size_t) {});
      for (std::size_t v = 0; v < model.variables().size(); ++v) {
        backend.apply_optimizer(sgd, model.param(v).data(), model.grad(v).data(), nullptr,
                                model.variables()[v].size, s.step, s.lr_scale);
      }
    };
    const auto graph = backend.make_step_graph(work);
    // Seconds per step of `step`; the warm-up records the graph.
    const auto time_steps = [&](const pstrain::StepWork& step) {
      for (std::uint64_t t = 1; t <= 3; ++t) {
        step({t, 1.0f});
        backend.synchronize();
      }
      const auto start = Clock::now();
      for (int t = 0; t < steps; ++t) {
        step({std::uint64_t(4 + t), 1.0f});
        backend.synchronize();
      }
      return seconds_since(start) / steps;
    };
    const double eager = time_steps(work);
    const double replayed = time_steps([&](const pstrain::StepScalars& s) { graph->run(s); });
    std::printf("%8d %12.3f %14.0f %12.3f %14.0f\n", batch, eager * 1e3, batch / eager,
                replayed * 1e3, batch / replayed);
  }
}

// Upload an input, run a GEMM-sized compute on it, download the result: once
// with the host waiting after each part (serialized), once issued back to
// back with the next upload issued before the current download (overlapped),
// so the copy stream works while the compute stream runs.
void bench_overlap(pstrain::Backend& backend, int iterations) {
  const int n = 4096;
  const std::size_t floats = std::size_t(n) * n, bytes = floats * sizeof(float);
  std::printf("\noverlap: per iteration upload %zu MiB, dense %dx%dx%d, download %zu MiB\n",
              bytes >> 20, n, n, n, bytes >> 20);
  pstrain::DeviceMemory in[2] = {backend.alloc(bytes), backend.alloc(bytes)};
  pstrain::DeviceMemory out[2] = {backend.alloc(bytes), backend.alloc(bytes)};
  pstrain::DeviceMemory w = backend.alloc(bytes), b = backend.alloc(n * sizeof(float));
  pstrain::HostMemory host_in = backend.alloc_host(bytes), host_out = backend.alloc_host(bytes);
  std::memset(host_in.data(), 0, bytes);
  backend.fill(w.data(), 1.0f / n, floats);
  backend.fill(b.data(), 0.0f, n);
  auto compute = [&](int i) {
    backend.dense_forward(in[i % 2].data(), w.data(), b.data(), out[i % 2].data(), n, n, n);
  };
  backend.synchronize();

  double up = 0, math = 0, down = 0;
  for (int i = 0; i < iterations + 1; ++i) {
    auto t0 = Clock::now();
    backend.upload(host_in.data(), in[i % 2].data(), bytes);
    backend.synchronize();
    const double u = seconds_since(t0);
    t0 = Clock::now();
    compute(i);
    backend.synchronize();
    const double c = seconds_since(t0);
    t0 = Clock::now();
    backend.download(out[i % 2].data(), host_out.data(), bytes);
    backend.synchronize();
    if (i > 0) up += u, math += c, down += seconds_since(t0);  // the first warms up
  }
  const double serialized = (up + math + down) / iterations;

  backend.upload(host_in.data(), in[0].data(), bytes);
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    compute(i);
    backend.upload(host_in.data(), in[(i + 1) % 2].data(), bytes);
    backend.download(out[i % 2].data(), host_out.data(), bytes);
  }
  backend.synchronize();
  const double overlapped = seconds_since(start) / iterations;
  std::printf("%28s %10.3f ms  (upload %.3f + compute %.3f + download %.3f)\n", "serialized",
              serialized * 1e3, up / iterations * 1e3, math / iterations * 1e3,
              down / iterations * 1e3);
  std::printf("%28s %10.3f ms  (%.2fx; copies in both directions share one copy stream)\n",
              "overlapped, two streams", overlapped * 1e3, serialized / overlapped);
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0, steps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--device") == 0)
      device = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--steps") == 0)
      steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_gpu: unknown option %s (expected --device N, --steps N)\n",
                   argv[i]);
      return 2;
    }
  }
  std::unique_ptr<pstrain::Backend> backend;
  try {
    if (pstrain::cuda::device_count() == 0)
      throw pstrain::cuda::CudaUnavailable("no CUDA device: 0 devices visible");
    backend = pstrain::cuda::make_cuda_backend(device);
  } catch (const pstrain::cuda::CudaUnavailable& e) {
    std::printf("bench_gpu: %s\n", e.what());
    return 77;
  }
  std::printf("bench_gpu on %s (library %s, architectures %s)\n", backend->name().c_str(),
              pstrain::cuda::library_path().c_str(), pstrain::cuda::architectures().c_str());
  bench_model(*backend, "mlp", steps);
  bench_model(*backend, "cnn", steps);
  bench_overlap(*backend, 10);
  return 0;
}
