#include "client/train/async_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "client/compute/backend.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/ps/ps_restarts.h"
#include "client/train/loss_scaler.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

TrainSummary train_async(const TrainContext& context, std::uint64_t first_step) {
  auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context;
  const auto& vars = model.variables();
  const std::size_t nv = vars.size();
  const HostViews host(backend, model, true);
  const PsRequestsGuard requests(ps);
  const bool direct = host.direct();
  auto weights = [&](std::size_t i) { return host.weights(i); };
  auto grads = [&](std::size_t i) { return host.grads(i); };
  BatchFeeder feeder(backend, model, shard, config.train.batch_size);
  // Forward and backward replayed from a CUDA graph where steps are
  // recorded (train.cuda_graphs): the gradients' downloads then follow the
  // whole backward instead of each layer's, which the saved launches more
  // than pay for on a GPU.
  GradAccumulator accumulator(
      backend, model, config.train.accumulate_steps,
      records_steps(config, backend) ? static_cast<int>(config.train.batch_size) : 0);
  const std::uint64_t steps = optimizer_steps(config, shard);

  const auto pull_all = [&] {
    for (std::size_t i = 0; i < nv; ++i) ps.pull(vars[i].name, weights(i));
    ps.wait_all();
  };
  ps.set_clock(first_step);
  pull_all();

  ProgressReporter reporter(context);
  auto& push_pull =
      reporter.mean_ms("push_pull_ms", "pstrain_worker_push_pull_seconds",
                       "Time from a step's first gradient sent to its last new weights received.");
  auto& wait = reporter.mean_ms("wait_ms", "pstrain_worker_wait_seconds",
                                "Time per step waiting for the ps's replies after the compute.");
  auto& staleness = reporter.mean(
      "staleness", "pstrain_worker_staleness",
      "Updates other workers applied between a pull and its push, mean over the variables.",
      {0, 1, 2, 4, 8, 16, 32, 64, 128});
  auto& max_staleness = reporter.max("max_staleness", "pstrain_worker_staleness_window_max",
                                     "Largest staleness since the last metrics line.");
  auto& ps_restarts = registry
                          .counter("pstrain_worker_ps_restarts_total",
                                   "Times this worker found servers restarted, said hello "
                                   "again and re-pulled.")
                          .with();
  struct Pending {
    std::size_t variable;
    Backend::Fence fence;
  };
  std::deque<Pending> pending;
  // fp16: a step's gradients go out only once all of them are known to be
  // finite (an overflow skips the step), so none is sent during backward.
  std::optional<LossScaler> scaler;
  if (scales_loss(config, backend)) scaler.emplace(registry);
  const auto finite = [](std::span<const float> g) {
    return std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); });
  };

  for (std::uint64_t step = first_step; step < steps; ++step) {
    // This step's pushes; their replies are the next step's weights, which
    // a ps in mode ssp holds until the slowest worker is near enough.
    ps.set_clock(step);
    if (rejoin_restarted_servers(ps)) {
      ps_restarts.add();
      pull_all();
    }
    if (!direct)
      for (std::size_t i = 0; i < nv; ++i)
        backend.upload(weights(i).data(), model.param(i).data(), weights(i).size_bytes());
    if (scaler) model.set_loss_scale(scaler->scale());
    const auto t_compute = Clock::now();
    // The micro-batches before the last only add to the gradient sum (a
    // batch's losses are readable once its step's work is done).
    std::size_t samples = 0;
    double loss_sum = 0;
    for (std::uint32_t m = micro_batches(config, shard, step); m > 1; --m) {
      const Batch b = feeder.load();
      accumulator.add(static_cast<int>(b.size));
      feeder.fetch_losses();
      feeder.stage_next();
      backend.synchronize();
      samples += b.size;
      loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
    }
    const Batch b = feeder.load();
    Clock::time_point t_first_send{};
    auto send = [&](std::size_t i) {
      if (t_first_send == Clock::time_point{}) t_first_send = Clock::now();
      ps.push_pull(vars[i].name, grads(i), weights(i));
    };
    const auto issued = [&](std::size_t i) {
      if (!scaler) send(i);
    };
    const auto grad_issued = [&](std::size_t i) {
      if (direct) return issued(i);
      backend.download(model.grad(i).data(), grads(i).data(), grads(i).size_bytes());
      pending.push_back({i, backend.fence()});
      while (!pending.empty() && backend.fence_done(pending.front().fence)) {
        issued(pending.front().variable);
        pending.pop_front();
      }
    };
    accumulator.finish(static_cast<int>(b.size), grad_issued);
    feeder.fetch_losses();
    feeder.stage_next();
    if (!direct) {
      for (; !pending.empty(); pending.pop_front()) {
        backend.wait(pending.front().fence);
        issued(pending.front().variable);
      }
      backend.synchronize();
    }
    if (scaler) {
      bool all_finite = true;
      for (std::size_t i = 0; i < nv && all_finite; ++i) all_finite = finite(grads(i));
      if (scaler->update(all_finite))
        for (std::size_t i = nv; i-- > 0;) send(i);
    }
    const auto t_wait = Clock::now();
    try {
      ps.wait_all();
    } catch (const PsError&) {
      // A ps that restarted without its checkpoint answers with errors (it
      // has no chunks): say that rather than what the errors say.
      rejoin_restarted_servers(ps);
      throw;
    }

    double stale = 0;
    for (const auto& v : vars) stale += ps.last_staleness(v.name);
    stale /= static_cast<double>(nv);

    samples += b.size;
    loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
    reporter.step(samples, loss_sum / static_cast<double>(samples),
                  std::chrono::duration<double>(t_wait - t_compute).count());
    if (t_first_send != Clock::time_point{}) push_pull.observe(seconds_since(t_first_send));
    wait.observe(seconds_since(t_wait));
    staleness.observe(stale);
    max_staleness.raise(stale);
    reporter.end_step(step + 1 == steps);
  }
  ps.finished_pushing();
  return reporter.finish();
}

}  // namespace pstrain
