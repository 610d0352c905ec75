// bench_step: one CPU worker's training step against one ps (a forked child
// on loopback tcp), for the mlp and cnn presets, split into pull, compute and
// push; beside it the compute alone (no ps) and the step as the async trainer
// runs it (each gradient sent as a push_pull while backward continues).
//
//   bench_step [--json] [steps] [batch]      defaults: 300 steps, batch 64, 1 thread
// --json prints one JSON object per model instead of the table (for tools/bench).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "client/cpu_backend.h"
#include "client/dataset.h"
#include "client/model.h"
#include "client/ps_client.h"
#include "server/ps_role.h"
#include "shared/child_process.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Row {
  std::string model;
  double compute_only = 0;  // samples/s without a ps
  double pull_ms = 0, compute_ms = 0, push_ms = 0;
  double sequential = 0;    // samples/s of pull + compute + push in turn
  double overlapped = 0;    // samples/s of the async trainer's step
};

ClusterConfig make_config(const std::string& preset, const std::filesystem::path& dir) {
  ClusterConfig c;
  c.job = "bench";
  c.run_dir = dir / preset;
  PsEndpoint e;
  e.port = free_port();
  c.ps.push_back(e);
  c.workers.resize(1);
  c.model.preset = preset;
  c.optimizer.kind = OptimizerKind::sgd;
  c.optimizer.lr = 0.01f;
  c.net.worker_timeout = 3600;
  return c;
}

Row measure(const ClusterConfig& config, const Dataset& data, int steps, int batch) {
  Row row{config.model.preset};
  auto backend = make_cpu_backend(1);
  Model model(config.model, *backend, InputShape{data.channels, data.height, data.width},
              data.classes, batch);
  WorkerShard shard(data, 0, 1, 1);
  PsClient ps(config, 0, shard_map_for(config, model.variables()));
  ps.hello();
  ps.init(1);
  const auto& vars = model.variables();
  auto weights = [&](std::size_t i) { return std::span<float>(model.param(i).data(), vars[i].size); };
  auto grads = [&](std::size_t i) { return std::span<const float>(model.grad(i).data(), vars[i].size); };
  auto next = [&] { shard.next_batch(batch, model.input_buffer(), model.label_buffer()); };
  const int warmup = std::max(10, steps / 10);
  const double samples = static_cast<double>(steps) * batch;

  // Real initial values: uninitialized memory can hold denormals, which
  // would time the CPU's slow path instead of the model.
  model.initialize(1);
  for (int s = 0; s < warmup; ++s) {
    next();
    model.forward_backward(batch, [](std::size_t) {});
  }
  auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    next();
    model.forward_backward(batch, [](std::size_t) {});
  }
  row.compute_only = samples / std::chrono::duration<double>(Clock::now() - t0).count();

  Clock::duration pull{}, compute{}, push{};
  for (int s = 0; s < warmup + steps; ++s) {
    const auto a = Clock::now();
    for (std::size_t i = 0; i < vars.size(); ++i) ps.pull(vars[i].name, weights(i));
    ps.wait_all();
    const auto b = Clock::now();
    next();
    model.forward_backward(batch, [](std::size_t) {});
    const auto c = Clock::now();
    for (std::size_t i = 0; i < vars.size(); ++i) ps.push(vars[i].name, grads(i));
    ps.wait_all();
    if (s == warmup) pull = compute = push = {};
    pull += b - a;
    compute += c - b;
    push += Clock::now() - c;
  }
  row.pull_ms = ms(pull) / steps;
  row.compute_ms = ms(compute) / steps;
  row.push_ms = ms(push) / steps;
  row.sequential = samples / std::chrono::duration<double>(pull + compute + push).count();

  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) t0 = Clock::now();
    next();
    model.forward_backward(batch, [&](std::size_t i) { ps.push_pull(vars[i].name, grads(i), weights(i)); });
    ps.wait_all();
  }
  row.overlapped = samples / std::chrono::duration<double>(Clock::now() - t0).count();
  return row;
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
  // Servers are forked before this process creates a ZeroMQ context.
  std::vector<std::unique_ptr<ChildProcess>> servers;
  for (const auto& c : configs)
    servers.push_back(std::make_unique<ChildProcess>(
        dir.path() / "ps.log", [&c] { return run_ps_role(c, 0, std::nullopt); }));

  DataConfig data_config;
  const Dataset data = load_dataset(data_config, true);
  if (!json) {
    std::printf("bench_step: 1 worker, 1 ps on loopback tcp, batch %d, 1 thread, %d steps, SGD on the ps\n\n",
                batch, steps);
    std::printf("%-5s %14s %9s %10s %9s %14s %14s\n", "model", "compute-only/s", "pull ms",
                "compute ms", "push ms", "sequential/s", "overlapped/s");
  }
  for (const auto& c : configs) {
    const int n = c.model.preset == "cnn" ? std::max(1, steps / 5) : steps;
    const Row r = measure(c, data, n, batch);
    if (json) {
      std::printf("{\"bench\": \"step\", \"model\": \"%s\", \"batch\": %d, \"steps\": %d, "
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
  if (!json)
    std::printf("\nsequential: pull, compute and push one after the other; overlapped: the async\n"
                "trainer's step, each gradient sent as push_pull while backward continues.\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_step: %s\n", e.what());
  return 1;
}
