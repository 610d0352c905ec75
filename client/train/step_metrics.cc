#include "client/train/step_metrics.h"

#include <algorithm>
#include <thread>

#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/straggler.h"
#include "shared/log.h"

namespace pstrain {

namespace {

// Step phases take from a tenth of a millisecond (a small model on a GPU) to
// seconds (a straggler, a slow network).
const std::vector<double> kStepSeconds = log_bounds(1e-4, 10);

}  // namespace

StepMetrics::StepMetrics(const TrainContext& context)
    : context_(context),
      // Worker 0's heartbeats also pace evaluations and progress, so it
      // reports more often than liveness alone needs.
      heartbeat_s_(context.index == 0 ? std::min(context.config.net.heartbeat, 0.25)
                                      : context.config.net.heartbeat),
      straggler_(straggles(context.config.train, context.index)),
      steps_(context.registry
                 .counter("pstrain_worker_steps_total", "Training steps this worker has taken.")
                 .with()),
      samples_(context.registry
                   .counter("pstrain_worker_samples_total", "Samples this worker has trained on.")
                   .with()),
      global_samples_(context.registry
                          .gauge("pstrain_worker_global_samples",
                                 "Samples all workers have trained on, as ps 0 "
                                 "counted them at this worker's last heartbeat.")
                          .with()),
      samples_per_s_(context.registry
                         .gauge("pstrain_worker_samples_per_second",
                                "This worker's samples per second over the window "
                                "since its previous metrics line.")
                         .with()),
      recent_loss_(context.registry
                       .gauge("pstrain_worker_recent_loss",
                              "Mean training loss of this worker's steps in the "
                              "window since its previous metrics line.")
                       .with()),
      loss_(context.registry
                .histogram("pstrain_worker_loss", "Mean training loss of each step.",
                           {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5})
                .with()),
      compute_(mean_ms("compute_ms", "pstrain_worker_compute_seconds",
                       "Forward and backward time per step.")),
      backend_ops_(context.registry.counter(
          "pstrain_worker_backend_ops_total",
          "Ops the compute backend issued, by op and the implementation that served it "
          "(cudnn or im2col, cublaslt or cublas, step graphs recorded or replayed).",
          {"op", "path"})),
      push_bytes_(context.registry.counter(
          "pstrain_worker_push_bytes_total",
          "Gradient bytes this worker's pushes sent (as=sent) and what they would have been in "
          "float32 (as=float32): net.wire_dtype's and net.compression's saving.",
          {"as"})),
      loss_mean_(loss_) {
  // An emulated worker's figures are not a device's: every scrape and every
  // metrics line says so.
  context.registry
      .gauge("pstrain_worker_emulated_step_seconds",
             "The stated time of an emulated worker's step (device: emulated); 0: it computes.")
      .with()
      .set(context.model.emulated() ? context.config.train.emulated_step_ms / 1000 : 0);
}

void StepMetrics::step(std::size_t samples, double loss, double compute_s) {
  steps_.add();
  samples_.add(static_cast<double>(samples));
  loss_.observe(loss);
  compute_.observe(compute_s);
}

Histogram& StepMetrics::mean(std::string field, std::string name, std::string help,
                             std::vector<double> bounds, double scale) {
  auto& h = context_.registry.histogram(std::move(name), std::move(help), std::move(bounds)).with();
  figures_.push_back({std::move(field), [window = WindowedMean(h), scale]() mutable {
                        return window.take() * scale;
                      }});
  return h;
}

Histogram& StepMetrics::mean_ms(std::string field, std::string name, std::string help) {
  return mean(std::move(field), std::move(name), std::move(help), kStepSeconds, 1e3);
}

Gauge& StepMetrics::max(std::string field, std::string name, std::string help) {
  auto& g = context_.registry.gauge(std::move(name), std::move(help)).with();
  figures_.push_back({std::move(field), [&g] { return g.reset(); }});
  return g;
}

Counter& StepMetrics::total(std::string field, std::string name, std::string help) {
  auto& c = context_.registry.counter(std::move(name), std::move(help)).with();
  figures_.push_back({std::move(field), [&c] { return c.value(); }});
  return c;
}

void StepMetrics::end_step(bool last) {
  if (straggler_)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(straggler_delay_ms(
        context_.config.train, context_.index, static_cast<std::uint64_t>(steps_.value()))));
  if (last || std::chrono::duration<double>(Clock::now() - last_heartbeat_).count() >= heartbeat_s_)
    report();
}

void StepMetrics::report() {
  const double samples = samples_.value();
  const auto window_samples = static_cast<std::uint64_t>(samples - window_samples_);
  // A report that fails (ps 0 restarting, a reply lost) does not stop
  // training: its samples go with the next one, and the data requests
  // tell whether the ps is really gone.
  auto global = static_cast<std::uint64_t>(global_samples_.value());
  try {
    global = context_.ps.report_progress(static_cast<std::uint64_t>(samples - reported_));
    reported_ = samples;
    if (report_failing_) log("progress reports reach ps 0 again");
    report_failing_ = false;
  } catch (const PsError& e) {
    if (!report_failing_) log("progress report failed (", e.what(), "); sent with the next one");
    report_failing_ = true;
  }
  global_samples_.set(static_cast<double>(global));
  last_heartbeat_ = Clock::now();
  const auto window =
      std::chrono::duration<double>(std::max(5.0, 5 * context_.config.net.heartbeat));
  global_history_.emplace_back(last_heartbeat_, global);
  while (global_history_.size() > 2 && last_heartbeat_ - global_history_[1].first >= window)
    global_history_.pop_front();
  const double epoch = samples / static_cast<double>(context_.shard.size());
  const double local_rate = static_cast<double>(window_samples) /
                            std::chrono::duration<double>(Clock::now() - window_start_).count();
  const auto& [oldest_time, oldest_samples] = global_history_.front();
  const double span = std::chrono::duration<double>(last_heartbeat_ - oldest_time).count();
  const double global_rate = global_history_.size() < 2 || span <= 0
                                 ? local_rate
                                 : static_cast<double>(global - oldest_samples) / span;
  const double loss = loss_mean_.take();
  samples_per_s_.set(local_rate);
  recent_loss_.set(loss);
  // The backend counts; its counters are raised to them.
  for (const auto& [key, count] : context_.backend.path_counts()) {
    const auto space = key.find(' ');
    Counter& c = backend_ops_.with(
        {key.substr(0, space), space == std::string::npos ? "" : key.substr(space + 1)});
    c.add(static_cast<double>(count) - c.value());
  }
  JsonObject line;
  line.add("role", "worker")
      .add("index", static_cast<int>(context_.index))
      .add("step", static_cast<std::uint64_t>(steps_.value()))
      .add("epoch", epoch)
      .add("local_samples", static_cast<std::uint64_t>(samples))
      .add("global_samples", global)
      .add("loss", loss)
      .add("samples_per_s", local_rate)
      .add("global_samples_per_s", global_rate);
  for (auto& f : figures_) line.add(f.field, f.take());
  if (const auto pushed = context_.ps.push_volume(); pushed.float32 > 0) {
    for (const auto& [as, bytes] :
         {std::pair{"sent", pushed.sent}, std::pair{"float32", pushed.float32}}) {
      Counter& c = push_bytes_.with({as});
      c.add(static_cast<double>(bytes) - c.value());
    }
    line.add("push_bytes", pushed.sent).add("push_bytes_float32", pushed.float32);
  }
  if (context_.model.emulated())
    line.add("emulated_step_ms", context_.config.train.emulated_step_ms);
  context_.metrics.write(line);
  if (context_.hook) context_.hook(global, epoch, loss, global_rate);
  window_start_ = Clock::now();
  window_samples_ = samples;
}

TrainSummary StepMetrics::finish() {
  return {static_cast<std::uint64_t>(samples_.value()),
          static_cast<std::uint64_t>(global_samples_.value()),
          static_cast<std::uint64_t>(steps_.value()),
          std::chrono::duration<double>(Clock::now() - start_).count()};
}

}  // namespace pstrain
