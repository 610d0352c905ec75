#pragma once
// A worker's per-step figures: the metrics registry's pstrain_worker_*
// series, the metrics file's lines, and the samples it reports to ps 0.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "client/train/train_context.h"

namespace pstrain {

// Records steps into the worker's metrics registry and, every net.heartbeat
// seconds (worker 0: every 0.25 s at most, as it also paces evaluations) and
// after the last step, sends the samples since the last report ps 0 answered
// to ps 0 (a failed report is logged and its samples go with the next),
// writes a metrics line rendered from the registry and calls the hook. The
// line (README.md, "Metrics") holds role, index, step, epoch, local_samples,
// global_samples, loss, samples_per_s, global_samples_per_s, compute_ms,
// then the trainer's figures in the order they were added (the backend's
// path counts go to the registry only); means and maxima
// are over the window since the line before. The worker's liveness does not
// depend on these reports: client/ps/heartbeat.h.
class StepMetrics {
 public:
  // Registers the worker's series (pstrain_worker_*) in context.registry.
  explicit StepMetrics(const TrainContext& context);

  // A finished step; `loss` is the batch's mean loss.
  void step(std::size_t samples, double loss, double compute_s);
  // A trainer figure: histogram `name` in the registry, written into the
  // line as `field`, the mean of its observations over the window times
  // `scale`.
  Histogram& mean(std::string field, std::string name, std::string help, std::vector<double> bounds,
                  double scale = 1);
  // A step's duration: histogram `name` of seconds (the registry's base
  // unit), written as `field` in milliseconds (the line's).
  Histogram& mean_ms(std::string field, std::string name, std::string help);
  // A trainer figure written as its maximum over the window: gauge `name`,
  // which the trainer raise()s and each line resets to 0.
  Gauge& max(std::string field, std::string name, std::string help);
  // A count since the worker started: counter `name`, written as `field`
  // with its value (not a window's).
  Counter& total(std::string field, std::string name, std::string help);
  // Ends the step: sleeps when this worker is a configured straggler (as
  // long as client/train/straggler.h says for its step count), and reports if a
  // heartbeat is due or `last`.
  void end_step(bool last);

  // The totals so far, with the seconds since construction.
  TrainSummary finish();

 private:
  using Clock = std::chrono::steady_clock;
  // A field of the line and how to take its value for the window ending now.
  struct Figure {
    std::string field;
    std::function<double()> take;
  };
  void report();

  const TrainContext& context_;
  double heartbeat_s_;
  bool straggler_;
  std::vector<Figure> figures_;  // declared before compute_, which mean_ms() adds to it
  Counter& steps_;
  Counter& samples_;
  Gauge& global_samples_;  // as ps 0 last counted them
  Gauge& samples_per_s_;   // the line's samples_per_s
  Gauge& recent_loss_;     // the line's loss
  Histogram& loss_;
  Histogram& compute_;
  // pstrain_worker_backend_ops_total{op, path}: Backend::path_counts, as of
  // the last report.
  MetricFamily<Counter>& backend_ops_;
  // pstrain_worker_push_bytes_total{as}: PsDataClient::push_volume, as of
  // the last report.
  MetricFamily<Counter>& push_bytes_;
  WindowedMean loss_mean_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_heartbeat_ = start_;
  // (time, global samples) of the heartbeats of the last few seconds: the
  // other workers report at their own pace, so the global rate is taken over
  // a window several of their heartbeats long rather than since our last.
  std::deque<std::pair<Clock::time_point, std::uint64_t>> global_history_;
  // The window since the last report, which is also the last heartbeat.
  Clock::time_point window_start_ = start_;
  double window_samples_ = 0;  // samples_ at its start
  double reported_ = 0;        // samples_ as of the last report ps 0 answered
  bool report_failing_ = false;
};

}  // namespace pstrain
