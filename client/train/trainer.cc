#include "client/train/trainer.h"

#include <chrono>

#include "client/model/model.h"
#include "client/train/batch_feeder.h"
#include "client/train/step_budget.h"
#include "client/train/step_metrics.h"
#include "client/train/step_strategy.h"

namespace pstrain {

TrainSummary train(const TrainContext& context, std::uint64_t first_step) {
  using Clock = std::chrono::steady_clock;
  const auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context;
  StepMetrics step_metrics(context);
  const auto strategy = make_step_strategy(context, step_metrics);
  const std::uint64_t steps = optimizer_steps(config, shard);
  while (true) {
    try {
      const std::uint64_t done = strategy->start(first_step);
      shard.seek(done * config.train.accumulate_steps, config.train.batch_size);
      // After the seek: it gathers batches ahead.
      BatchFeeder feeder(backend, model, shard, config.train.batch_size);
      for (std::uint64_t step = done; step < steps; ++step) {
        strategy->begin(step);
        const auto t_compute = Clock::now();
        // The micro-batches before the last only add to the step's gradient
        // (a batch's losses are readable once its work is done).
        std::size_t samples = 0;
        double loss_sum = 0;
        for (std::uint32_t m = micro_batches(config, shard, step); m > 1; --m) {
          const Batch b = feeder.load();
          strategy->accumulate(static_cast<int>(b.size));
          feeder.fetch_losses();
          feeder.stage_next();
          backend.synchronize();
          samples += b.size;
          loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
        }
        const Batch b = feeder.load();
        strategy->issue(step, static_cast<int>(b.size));
        const double compute_s = std::chrono::duration<double>(Clock::now() - t_compute).count();
        feeder.fetch_losses();
        feeder.stage_next();
        const bool last = step + 1 == steps;
        strategy->finish(step, last);
        samples += b.size;
        loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
        step_metrics.step(samples, loss_sum / static_cast<double>(samples), compute_s);
        step_metrics.end_step(last);
      }
      strategy->end();
      return step_metrics.finish();
    } catch (const CommError& e) {
      if (!strategy->recover(e)) throw;
    }
  }
}

}  // namespace pstrain
