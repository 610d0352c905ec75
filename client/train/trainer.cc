#include "client/train/trainer.h"

#include <chrono>
#include <optional>

#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/batch_feeder.h"
#include "client/train/embedding_exchange.h"
#include "client/train/step_budget.h"
#include "client/train/step_metrics.h"
#include "client/train/step_strategy.h"
#include "shared/trace.h"

namespace pstrain {
namespace {

// Runs `part` of a step inside a span of that name.
template <typename F>
auto traced(const char* name, F&& part) {
  const TraceSpan span(name, "step");
  return part();
}

}  // namespace

TrainSummary train(const TrainContext& context, std::uint64_t first_step) {
  using Clock = std::chrono::steady_clock;
  const auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context;
  StepMetrics step_metrics(context);
  const auto strategy = make_step_strategy(context, step_metrics);
  const std::uint64_t steps = optimizer_steps(config, shard);
  Counter& rows_pulled =
      registry
          .counter("pstrain_worker_embedding_rows_total",
                   "Embedding layers: unique rows of the batches trained, over all layers.")
          .with();
  Counter& rows_stale =
      registry
          .counter("pstrain_worker_embedding_stale_rows_total",
                   "Of those, rows prefetched (train.prefetch) before this worker's push of the "
                   "batch before, which also had them, was applied: one update stale.")
          .with();
  std::vector<std::uint64_t> next_ids;  // the next batch's, for a prefetch
  // With --trace: train.trace_steps steps recorded after train.trace_skip;
  // the start (hellos, first pulls) is not the steady state.
  const std::uint64_t trace_from = first_step + config.train.trace_skip;
  const std::uint64_t trace_to = trace_from + config.train.trace_steps;
  std::string step_name;  // outlives the step's span
  while (true) {
    trace::pause(true);
    try {
      const std::uint64_t done = strategy->start(first_step);
      shard.seek(done * config.train.accumulate_steps, config.train.batch_size);
      // After the seek: it gathers batches ahead.
      BatchFeeder feeder(backend, model, shard, config.train.batch_size);
      // Embedding layers: each batch's rows come from the ps before its
      // forward, their gradients go back after its backward.
      std::optional<EmbeddingExchange> rows;
      if (!model.embeddings().empty()) rows.emplace(model, ps, config.tables);
      // With train.prefetch, the next batch's rows are asked for before
      // this one computes (`more`: a batch follows this one).
      const auto pull_rows = [&](const Batch& b, bool more) {
        if (!rows) return;
        rows->pull_samples(static_cast<int>(b.size), feeder.ids());
        // Through `context`: a lambda may not capture structured bindings.
        if (context.config.train.prefetch > 0 && more) {
          const auto n = context.shard.peek_ids(context.config.train.batch_size, next_ids);
          rows->prefetch(static_cast<int>(n), next_ids);
        }
        rows_pulled.add(static_cast<double>(rows->last_rows()));
        rows_stale.add(static_cast<double>(rows->last_stale_rows()));
      };
      // The rows' share of a step of m micro-batches: 1/m each, where the
      // dense gradients are weighted by their micro-batch's size
      // (client/train/grad_accumulator.h); the two differ only in a step
      // that takes an epoch's shorter last batch.
      const auto push_rows = [&](std::uint32_t m) {
        if (rows) rows->push(1.0f / static_cast<float>(m));
      };
      for (std::uint64_t step = done; step < steps; ++step) {
        trace::pause(step < trace_from || step >= trace_to);
        if (trace::on()) step_name = std::to_string(step);
        const TraceSpan step_span("step", "step", step_name);
        {
          const TraceSpan span("begin", "step");
          strategy->begin(step);
        }
        const auto t_compute = Clock::now();
        // The micro-batches before the last only add to the step's gradient
        // (a batch's losses are readable once its work is done).
        std::size_t samples = 0;
        double loss_sum = 0;
        const std::uint32_t micro = micro_batches(config, shard, step);
        for (std::uint32_t m = micro; m > 1; --m) {
          const Batch b = feeder.load();
          pull_rows(b, true);
          strategy->accumulate(static_cast<int>(b.size));
          push_rows(micro);
          feeder.fetch_losses();
          feeder.stage_next();
          backend.synchronize();
          samples += b.size;
          loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
        }
        const Batch b = traced("load batch", [&] { return feeder.load(); });
        traced("pull rows", [&] { pull_rows(b, step + 1 < steps); });
        traced("forward and backward", [&] { strategy->issue(step, static_cast<int>(b.size)); });
        const double compute_s = std::chrono::duration<double>(Clock::now() - t_compute).count();
        traced("losses and next batch", [&] {
          feeder.fetch_losses();
          feeder.stage_next();
        });
        const bool last = step + 1 == steps;
        traced("finish", [&] { strategy->finish(step, last); });
        traced("push rows", [&] { push_rows(micro); });
        samples += b.size;
        loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
        traced("metrics", [&] {
          step_metrics.step(samples, loss_sum / static_cast<double>(samples), compute_s);
          step_metrics.end_step(last);
        });
      }
      trace::pause(true);
      if (rows) rows->wait();
      strategy->end();
      return step_metrics.finish();
    } catch (const CommError& e) {
      if (!strategy->recover(e)) throw;
    }
  }
}

}  // namespace pstrain
