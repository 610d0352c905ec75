// bench_step: one CPU worker's training step against one ps (a forked child
// on loopback tcp), for the mlp and cnn presets, split into pull, compute and
// push; beside it the compute alone (no ps) and the step as the async trainer
// runs it (each gradient sent as a push_pull while backward continues).
//
// Then what metrics cost: the MLP's async step against a ps with
// metrics.enabled whose /metrics a thread of this process scrapes every
// 100 ms (ten times Prometheus' usual rate at the launcher's 1 s), and
// against one without, alternated rep by rep in one run.
//
//   bench_step [--json] [steps] [batch]      defaults: 300 steps, batch 64, 1 thread
// --json prints one JSON object per model instead of the tables, and skips
// the metrics comparison (for tools/bench).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "server/ps_role.h"
#include "tests/support/child_process.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Row {
  std::string model;
  double compute_only = 0;  // samples/s without a ps
  double pull_ms = 0, compute_ms = 0, push_ms = 0;
  double sequential = 0;  // samples/s of pull + compute + push in turn
  double overlapped = 0;  // samples/s of the async trainer's step
};

ClusterConfig make_config(const std::string& preset, const std::filesystem::path& dir,
                          bool metrics = false) {
  ClusterConfig c;
  c.job = "bench";
  c.run_dir = dir / (preset + (metrics ? "-metrics" : ""));
  PsEndpoint e;
  e.port = free_port();
  c.ps.push_back(e);
  c.workers.resize(1);
  c.model.preset = preset;
  c.optimizer.kind = OptimizerKind::sgd;
  c.optimizer.lr = 0.01f;
  c.net.worker_timeout = 3600;
  c.metrics.enabled = metrics;
  c.metrics.port_base = free_port();
  return c;
}

// One worker's model and ps client against the ps of `config`, initialized.
class StepBench {
 public:
  StepBench(const ClusterConfig& config, const Dataset& data, int batch)
      : batch_(batch),
        backend_(make_cpu_backend(1)),
        model_(config.model, *backend_, InputShape{data.channels, data.height, data.width},
               data.classes, batch),
        shard_(data, 0, 1, 1),
        ps_(config, 0, shard_map_for(config, model_.variables())) {
    ps_.hello();
    ps_.init(1);
    // Real initial values: uninitialized memory can hold denormals, which
    // would time the CPU's slow path instead of the model.
    model_.initialize(1);
  }

  // Samples/s of forward and backward alone, no ps.
  double compute_only(int steps) {
    const auto none = [](std::size_t) {};
    run(warmup(steps), none);
    const auto t0 = Clock::now();
    run(steps, none);
    return samples(steps) / std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Pull, compute and push one after the other: each part's ms per step,
  // and the samples/s of the three in turn.
  void split(int steps, Row& row) {
    const auto& vars = model_.variables();
    Clock::duration pull{}, compute{}, push{};
    const int warm = warmup(steps);
    for (int s = 0; s < warm + steps; ++s) {
      const auto a = Clock::now();
      for (std::size_t i = 0; i < vars.size(); ++i) ps_.pull(vars[i].name, weights(i));
      ps_.wait_all();
      const auto b = Clock::now();
      run(1, [](std::size_t) {});
      const auto c = Clock::now();
      for (std::size_t i = 0; i < vars.size(); ++i) ps_.push(vars[i].name, grads(i));
      ps_.wait_all();
      if (s == warm) pull = compute = push = {};
      pull += b - a;
      compute += c - b;
      push += Clock::now() - c;
    }
    row.pull_ms = ms(pull) / steps;
    row.compute_ms = ms(compute) / steps;
    row.push_ms = ms(push) / steps;
    row.sequential = samples(steps) / std::chrono::duration<double>(pull + compute + push).count();
  }

  // Samples/s of the async trainer's step: each gradient sent as a
  // push_pull while backward continues.
  double overlapped(int steps) {
    const auto& vars = model_.variables();
    const auto push_pull = [&](std::size_t i) {
      ps_.push_pull(vars[i].name, grads(i), weights(i));
    };
    run(warmup(steps), push_pull);
    const auto t0 = Clock::now();
    run(steps, push_pull);
    return samples(steps) / std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  static int warmup(int steps) { return std::max(10, steps / 10); }
  double samples(int steps) const { return static_cast<double>(steps) * batch_; }
  std::span<float> weights(std::size_t i) {
    return {model_.param(i).data(), model_.variables()[i].size};
  }
  std::span<const float> grads(std::size_t i) {
    return {model_.grad(i).data(), model_.variables()[i].size};
  }
  // `steps` forward and backward passes on the next batches, `ready` called
  // with each variable as backward produces its gradient, then the ps's
  // replies awaited.
  template <class Ready>
  void run(int steps, const Ready& ready) {
    for (int s = 0; s < steps; ++s) {
      shard_.next_batch(batch_, model_.input_buffer(), model_.label_buffer());
      model_.forward_backward(batch_, ready);
      ps_.wait_all();
    }
  }

  int batch_;
  std::unique_ptr<Backend> backend_;
  Model model_;
  WorkerShard shard_;
  PsClient ps_;
};

// Fetches http://127.0.0.1:port/metrics every `every` until destroyed.
class Scraper {
 public:
  Scraper(std::uint16_t port, std::chrono::milliseconds every)
      : thread_([this, port, every](std::stop_token stop) {
          httplib::Client client("127.0.0.1", port);
          while (!stop.stop_requested()) {
            if (const auto r = client.Get("/metrics"); r && r->status == 200) ++scrapes_;
            std::this_thread::sleep_for(every);
          }
        }) {}
  int scrapes() const { return scrapes_; }

 private:
  std::atomic<int> scrapes_{0};
  std::jthread thread_;  // last: it starts once scrapes_ exists
};

double median(std::vector<double> v) {
  std::ranges::sort(v);
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  const bool json = argc > 1 && std::string(argv[1]) == "--json";
  const int first = json ? 2 : 1;
  const int steps = argc > first ? std::atoi(argv[first]) : 300;
  const int batch = argc > first + 1 ? std::atoi(argv[first + 1]) : 64;
  if (steps < 1 || batch < 1 || argc > first + 2) {
    std::fprintf(stderr, "usage: bench_step [--json] [steps >= 1] [batch >= 1]\n");
    return 2;
  }
  TempDir dir;
  const ClusterConfig configs[] = {make_config("mlp", dir.path()), make_config("cnn", dir.path())};
  const ClusterConfig scraped = make_config("mlp", dir.path(), true);
  // Servers are forked before this process creates a ZeroMQ context.
  std::vector<std::unique_ptr<ChildProcess>> servers;
  for (const auto* c : {&configs[0], &configs[1], &scraped})
    servers.push_back(std::make_unique<ChildProcess>(
        dir.path() / "ps.log", [c] { return run_ps_role(*c, 0, std::nullopt); }));

  DataConfig data_config;
  const Dataset data = load_dataset(data_config, true);
  if (!json) {
    std::printf(
        "bench_step: 1 worker, 1 ps on loopback tcp, batch %d, 1 thread, %d steps, SGD on the "
        "ps\n\n",
        batch, steps);
    std::printf("%-5s %14s %9s %10s %9s %14s %14s\n", "model", "compute-only/s", "pull ms",
                "compute ms", "push ms", "sequential/s", "overlapped/s");
  }
  for (const auto& c : configs) {
    const int n = c.model.preset == "cnn" ? std::max(1, steps / 5) : steps;
    StepBench bench(c, data, batch);
    Row r{c.model.preset};
    r.compute_only = bench.compute_only(n);
    bench.split(n, r);
    r.overlapped = bench.overlapped(n);
    if (json) {
      std::printf(
          "{\"bench\": \"step\", \"model\": \"%s\", \"batch\": %d, \"steps\": %d, "
          "\"compute_only\": %.1f, \"pull_ms\": %.4f, \"compute_ms\": %.4f, "
          "\"push_ms\": %.4f, \"sequential\": %.1f, \"overlapped\": %.1f}\n",
          r.model.c_str(), batch, n, r.compute_only, r.pull_ms, r.compute_ms, r.push_ms,
          r.sequential, r.overlapped);
      std::fflush(stdout);
      continue;
    }
    std::printf("%-5s %14.0f %9.3f %10.3f %9.3f %14.0f %14.0f\n", r.model.c_str(), r.compute_only,
                r.pull_ms, r.compute_ms, r.push_ms, r.sequential, r.overlapped);
  }
  if (json) return 0;
  std::printf(
      "\nsequential: pull, compute and push one after the other; overlapped: the async\n"
      "trainer's step, each gradient sent as push_pull while backward continues.\n");

  constexpr int kReps = 15;
  StepBench off(configs[0], data, batch), on(scraped, data, batch);
  std::vector<double> rate_off, rate_on, ratio;
  int scrapes = 0;
  const auto measure_on = [&] {
    Scraper scraper(metrics_port(scraped, true, 0), std::chrono::milliseconds(100));
    rate_on.push_back(on.overlapped(steps));
    scrapes += scraper.scrapes();
  };
  for (int rep = 0; rep < kReps; ++rep) {
    // Each goes first every other rep, so a drift of the machine's speed
    // favours neither.
    if (rep % 2) measure_on();
    rate_off.push_back(off.overlapped(steps));
    if (rep % 2 == 0) measure_on();
    ratio.push_back(rate_on.back() / rate_off.back());
  }
  std::printf(
      "\nmetrics: the mlp's overlapped step, %d reps alternated, median samples/s\n"
      "  off %.0f, on (ps serving /metrics, %d scrapes at 100 ms) %.0f: on/off %.4f "
      "(overhead %.2f%%; reps %.3f..%.3f)\n",
      kReps, median(rate_off), scrapes, median(rate_on), median(ratio), 100 * (1 - median(ratio)),
      *std::ranges::min_element(ratio), *std::ranges::max_element(ratio));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_step: %s\n", e.what());
  return 1;
}
