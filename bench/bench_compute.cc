// Worker compute throughput: forward + backward + loss of the mlp and cnn
// presets on the CPU backend, as samples/s. Its peer (PyTorch on the same
// shapes) runs beside it under tools/bench, never as a figure written here.
//
// usage: bench_compute [--json] [--model mlp|cnn] [--precision fp32|bf16|fp16]
//                      [threads=1] [batch=64] [windows=7]
// Each model warms up, then runs `windows` timed windows of about 0.5 s; the
// median, min and max are reported. A second pass through a timing wrapper
// splits one step's time by layer and direction (the wrapper's own cost is
// small against it). PSTRAIN_CPU_KERNELS picks the kernel library
// (client/compute/cpu/cpu_backend.h); the backend's name says which ran. --json prints
// one JSON object per model instead, without the split, for tools/bench.
// --precision sets the GEMMs' precision (train.precision); one the CPU lacks
// is an error naming why.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Forwards every call to the CPU backend and adds its wall time to a bucket
// per operation kind; the CPU backend is synchronous, so that is its cost.
class TimedBackend final : public Backend {
 public:
  explicit TimedBackend(Backend& inner) : inner_(inner) {}
  std::map<std::string, double> seconds;

  std::string name() const override { return inner_.name(); }
  bool host_accessible() const override { return inner_.host_accessible(); }
  // Memory stays owned (and is freed) by the inner backend.
  DeviceMemory alloc(std::size_t bytes) override { return inner_.alloc(bytes); }
  HostMemory alloc_host(std::size_t bytes) override { return inner_.alloc_host(bytes); }
  void release(void* p) noexcept override { inner_.release(p); }
  void release_host(void* p) noexcept override { inner_.release_host(p); }
  void upload(const void* h, void* d, std::size_t b) override { inner_.upload(h, d, b); }
  void download(const void* d, void* h, std::size_t b) override { inner_.download(d, h, b); }
  void fill(float* d, float v, std::size_t n) override { inner_.fill(d, v, n); }
  Fence fence() override { return inner_.fence(); }
  bool fence_done(Fence f) override { return inner_.fence_done(f); }
  void wait(Fence f) override { inner_.wait(f); }

  void dense_forward(const float* x, const float* w, const float* b, float* y, int n, int in,
                     int out) override {
    time(dense_name(in, out) + " forward", [&] { inner_.dense_forward(x, w, b, y, n, in, out); });
  }
  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int n, int in, int out) override {
    time(dense_name(in, out) + " backward",
         [&] { inner_.dense_backward(x, w, dy, dx, dw, db, n, in, out); });
  }
  void relu_forward(const float* x, float* y, std::size_t n) override {
    time("elementwise", [&] { inner_.relu_forward(x, y, n); });
  }
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    time("elementwise", [&] { inner_.relu_backward(y, dy, dx, n); });
  }
  std::size_t conv2d_workspace(const ConvShape& s) const override {
    return inner_.conv2d_workspace(s);
  }
  std::size_t conv2d_columns(const ConvShape& s) const override { return inner_.conv2d_columns(s); }
  void conv2d_forward(const float* x, const float* w, const float* b, float* y, float* ws,
                      float* columns, const ConvShape& s) override {
    time(conv_name(s) + " forward", [&] { inner_.conv2d_forward(x, w, b, y, ws, columns, s); });
  }
  void conv2d_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, float* ws, const float* columns, const ConvShape& s) override {
    time(conv_name(s) + " backward",
         [&] { inner_.conv2d_backward(x, w, dy, dx, dw, db, ws, columns, s); });
  }
  void maxpool_forward(const float* x, float* y, std::int32_t* a, const PoolShape& s) override {
    time(pool_name(s) + " forward", [&] { inner_.maxpool_forward(x, y, a, s); });
  }
  void maxpool_backward(const float* dy, const std::int32_t* a, float* dx,
                        const PoolShape& s) override {
    time(pool_name(s) + " backward", [&] { inner_.maxpool_backward(dy, a, dx, s); });
  }
  void softmax_xent(const float* l, const std::int32_t* y, float* d, float* loss, float* c, int n,
                    int k) override {
    time("elementwise", [&] { inner_.softmax_xent(l, y, d, loss, c, n, k); });
  }
  void bce_logits(const float* l, const std::int32_t* y, float* d, float* loss, float* c,
                  int n) override {
    time("elementwise", [&] { inner_.bce_logits(l, y, d, loss, c, n); });
  }
  void dot_interaction_forward(const float* x, float* y, const InteractionShape& s) override {
    time("interaction", [&] { inner_.dot_interaction_forward(x, y, s); });
  }
  void dot_interaction_backward(const float* x, const float* dy, float* dx,
                                const InteractionShape& s) override {
    time("interaction", [&] { inner_.dot_interaction_backward(x, dy, dx, s); });
  }
  void embedding_forward(const float* rows, const std::int32_t* inverse, float* out,
                         const EmbeddingShape& s) override {
    time("embedding", [&] { inner_.embedding_forward(rows, inverse, out, s); });
  }
  void embedding_backward(const float* dout, const std::int32_t* by_row,
                          const std::int32_t* offsets, float* drows,
                          const EmbeddingShape& s) override {
    time("embedding", [&] { inner_.embedding_backward(dout, by_row, offsets, drows, s); });
  }
  void copy_columns(const float* src, std::size_t src_stride, float* dst, std::size_t dst_stride,
                    std::size_t rows, std::size_t cols) override {
    time("elementwise", [&] { inner_.copy_columns(src, src_stride, dst, dst_stride, rows, cols); });
  }
  void scale(float* x, float a, std::size_t n) override { inner_.scale(x, a, n); }
  void apply_optimizer(const OptimizerConfig& c, float* w, const float* g, float* s, std::size_t n,
                       std::uint64_t step, float lr) override {
    inner_.apply_optimizer(c, w, g, s, n, step, lr);
  }

 private:
  // A layer's bucket name from its shape, which tells the layers of the
  // presets apart.
  static std::string dense_name(int in, int out) {
    return "dense " + std::to_string(in) + "->" + std::to_string(out);
  }
  static std::string conv_name(const ConvShape& s) {
    return "conv " + std::to_string(s.c) + "->" + std::to_string(s.filters) + " on " +
           std::to_string(s.h) + "x" + std::to_string(s.w);
  }
  static std::string pool_name(const PoolShape& s) {
    return "maxpool " + std::to_string(s.c) + " x " + std::to_string(s.h) + "x" +
           std::to_string(s.w);
  }

  template <class F>
  void time(const std::string& bucket, F&& f) {
    const auto start = Clock::now();
    f();
    seconds[bucket] += seconds_since(start);
  }
  Backend& inner_;
};

struct Result {
  std::vector<double> rates;            // samples/s of each window, sorted
  std::map<std::string, double> split;  // ms of a step per layer and direction
  double step_ms = 0;
};

void fill_batch(Model& model, const Dataset& data, int batch) {
  std::copy_n(data.images.data(), static_cast<std::size_t>(batch) * data.sample_floats(),
              model.input_buffer());
  std::copy_n(data.labels.data(), batch, model.label_buffer());
}

Result measure(const std::string& preset, Backend& backend, const Dataset& data, int batch,
               int windows, bool with_split) {
  ModelConfig config;
  config.preset = preset;
  Model model(config, backend, {}, 10, batch);
  model.initialize(1);
  fill_batch(model, data, batch);
  auto step = [&] { model.forward_backward(batch, [](std::size_t) {}); };

  // Warm-up, and the number of steps that fills a window of about 0.5 s.
  int steps = 1;
  for (;;) {
    const auto start = Clock::now();
    for (int i = 0; i < steps; ++i) step();
    const double took = seconds_since(start);
    if (took > 0.25) {
      steps = std::max(1, static_cast<int>(steps * 0.5 / took));
      break;
    }
    steps *= 2;
  }
  std::vector<double> rates;
  for (int w = 0; w < windows; ++w) {
    const auto start = Clock::now();
    for (int i = 0; i < steps; ++i) step();
    rates.push_back(static_cast<double>(steps) * batch / seconds_since(start));
  }
  std::sort(rates.begin(), rates.end());
  Result result;
  result.rates = rates;
  if (!with_split) return result;

  TimedBackend timed(backend);
  Model timed_model(config, timed, {}, 10, batch);
  timed_model.initialize(1);
  fill_batch(timed_model, data, batch);
  timed_model.forward_backward(batch, [](std::size_t) {});  // first-touch page faults
  timed.seconds.clear();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) timed_model.forward_backward(batch, [](std::size_t) {});
  const double total = seconds_since(start);
  double covered = 0;
  for (const auto& [bucket, s] : timed.seconds) {
    result.split[bucket] = 1e3 * s / steps;
    covered += s;
  }
  result.split["other (model glue)"] = 1e3 * std::max(0.0, total - covered) / steps;
  result.step_ms = 1e3 * total / steps;
  return result;
}

}  // namespace

int main(int argc, char** argv) try {
  bool json = false;
  std::vector<std::string> presets = {"mlp", "cnn"}, positional;
  Precision precision = Precision::fp32;
  bool precision_known = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json")
      json = true;
    else if (arg == "--model" && i + 1 < argc)
      presets = {argv[++i]};
    else if (arg == "--precision" && i + 1 < argc) {
      const std::string name = argv[++i];
      precision_known = false;
      for (const Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
        if (name == to_string(p)) {
          precision = p;
          precision_known = true;
        }
    } else
      positional.push_back(arg);
  }
  auto number = [&](std::size_t i, int fallback) {
    return i < positional.size() ? std::atoi(positional[i].c_str()) : fallback;
  };
  const int threads = number(0, 1), batch = number(1, 64), windows = number(2, 7);
  if (threads < 1 || batch < 1 || windows < 1 || positional.size() > 3 || !precision_known) {
    std::fprintf(stderr,
                 "usage: bench_compute [--json] [--model mlp|cnn] [--precision fp32|bf16|fp16] "
                 "[threads>=1] [batch>=1] [windows>=1]\n");
    return 2;
  }
  auto backend = make_cpu_backend(threads);
  backend->set_precision(precision);
  const Dataset data = make_synthetic(static_cast<std::size_t>(batch), true);

  if (!json) {
    std::printf("backend: %s, batch %d, precision %s, %d windows\n\n", backend->name().c_str(),
                batch, std::string(to_string(precision)).c_str(), windows);
    std::printf("| model | median samples/s | min | max |\n|---|---|---|---|\n");
  }
  std::vector<std::pair<std::string, Result>> results;
  for (const auto& preset : presets) {
    const Result r = measure(preset, *backend, data, batch, windows, !json);
    if (json) {
      std::printf(
          "{\"bench\": \"compute\", \"model\": \"%s\", \"threads\": %d, "
          "\"batch\": %d, \"backend\": \"%s\", \"samples_per_s\": [",
          preset.c_str(), threads, batch, backend->name().c_str());
      for (std::size_t i = 0; i < r.rates.size(); ++i)
        std::printf("%s%.1f", i ? ", " : "", r.rates[i]);
      std::printf("]}\n");
    } else {
      std::printf("| %s | %.0f | %.0f | %.0f |\n", preset.c_str(), r.rates[r.rates.size() / 2],
                  r.rates.front(), r.rates.back());
    }
    std::fflush(stdout);
    results.emplace_back(preset, r);
  }
  if (json) return 0;
  std::printf(
      "\none training step by layer and direction\n\n| model | operation | ms per step | share "
      "|\n|---|---|---|---|\n");
  for (const auto& [preset, r] : results) {
    for (const auto& [bucket, ms] : r.split) {
      std::printf("| %s | %s | %.3f | %.1f%% |\n", preset.c_str(), bucket.c_str(), ms,
                  100 * ms / r.step_ms);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_compute: %s\n", e.what());
  return 1;
}
