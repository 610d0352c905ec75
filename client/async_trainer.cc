#include "client/async_trainer.h"

#include <chrono>
#include <deque>
#include <span>
#include <vector>

#include "client/backend.h"
#include "client/model.h"
#include "client/ps_client.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

TrainSummary train_async(const TrainContext& context) {
  auto& [config, index, backend, model, ps, shard, metrics, hook] = context;
  const auto& vars = model.variables();
  const std::size_t nv = vars.size();
  const HostViews host(backend, model, true);
  const bool direct = host.direct();
  auto weights = [&](std::size_t i) { return host.weights(i); };
  auto grads = [&](std::size_t i) { return host.grads(i); };
  BatchFeeder feeder(backend, model, shard, config.train.batch_size);
  const std::uint64_t steps = total_steps(config, shard);

  for (std::size_t i = 0; i < nv; ++i) ps.pull(vars[i].name, weights(i));
  ps.wait_all();

  ProgressReporter reporter(config, index, ps, shard, metrics, hook);
  struct Pending {
    std::size_t variable;
    Backend::Fence fence;
  };
  std::deque<Pending> pending;

  for (std::uint64_t step = 0; step < steps; ++step) {
    if (!direct)
      for (std::size_t i = 0; i < nv; ++i)
        backend.upload(weights(i).data(), model.param(i).data(), weights(i).size_bytes());
    const Batch b = feeder.load();

    const auto t_compute = Clock::now();
    Clock::time_point t_first_send{};
    auto send = [&](std::size_t i) {
      if (t_first_send == Clock::time_point{}) t_first_send = Clock::now();
      ps.push_pull(vars[i].name, grads(i), weights(i));
    };
    model.forward_backward(static_cast<int>(b.size), [&](std::size_t i) {
      if (direct) return send(i);
      backend.download(model.grad(i).data(), grads(i).data(), grads(i).size_bytes());
      pending.push_back({i, backend.fence()});
      while (!pending.empty() && backend.fence_done(pending.front().fence)) {
        send(pending.front().variable);
        pending.pop_front();
      }
    });
    feeder.fetch_losses();
    feeder.stage_next();
    if (!direct) {
      for (; !pending.empty(); pending.pop_front()) {
        backend.wait(pending.front().fence);
        send(pending.front().variable);
      }
      backend.synchronize();
    }
    const auto t_wait = Clock::now();
    ps.wait_all();

    double staleness = 0;
    for (const auto& v : vars) staleness += ps.last_staleness(v.name);
    staleness /= static_cast<double>(nv);

    reporter.step(b.size, feeder.mean_loss(),
                  std::chrono::duration<double, std::milli>(t_wait - t_compute).count());
    reporter.add_mean("push_pull_ms", ms_since(t_first_send));
    reporter.add_mean("wait_ms", ms_since(t_wait));
    reporter.add_mean("staleness", staleness);
    reporter.add_max("max_staleness", staleness);
    reporter.end_step(step + 1 == steps);
  }
  return reporter.finish();
}

}  // namespace pstrain
