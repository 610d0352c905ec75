#include "client/train/train_loop.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/straggler.h"
#include "shared/log.h"

namespace pstrain {

std::uint64_t total_steps(const ClusterConfig& config, const WorkerShard& shard) {
  const auto batches = shard.batches_per_epoch(config.train.batch_size);
  return static_cast<std::uint64_t>(std::ceil(config.train.epochs * static_cast<double>(batches)));
}

std::uint64_t optimizer_steps(const ClusterConfig& config, const WorkerShard& shard) {
  const std::uint64_t k = config.train.accumulate_steps;
  return (total_steps(config, shard) + k - 1) / k;
}

std::uint32_t micro_batches(const ClusterConfig& config, const WorkerShard& shard,
                            std::uint64_t step) {
  const std::uint64_t k = config.train.accumulate_steps;
  return static_cast<std::uint32_t>(std::min(k, total_steps(config, shard) - step * k));
}

std::uint64_t steps_for_samples(const WorkerShard& shard, std::uint64_t samples,
                                std::size_t batch_size) {
  const std::uint64_t per_epoch = shard.size();
  return samples / per_epoch * shard.batches_per_epoch(batch_size) +
         samples % per_epoch / batch_size;
}

HostViews::HostViews(Backend& backend, Model& model, bool grads)
    : direct_(backend.host_accessible()) {
  const auto& vars = model.variables();
  auto view = [&](DeviceMemory& memory, std::size_t n) -> std::span<float> {
    if (direct_) return {memory.data(), n};
    staging_.push_back(backend.alloc_host(n * sizeof(float)));
    return {staging_.back().data(), n};
  };
  for (std::size_t i = 0; i < vars.size(); ++i) {
    weights_.push_back(view(model.param(i), vars[i].size));
    if (grads) grads_.push_back(view(model.grad(i), vars[i].size));
  }
}

PsRequestsGuard::PsRequestsGuard(PsClient& ps) : ps_(ps), exceptions_(std::uncaught_exceptions()) {}

PsRequestsGuard::~PsRequestsGuard() {
  if (std::uncaught_exceptions() <= exceptions_) return;
  try {
    ps_.abandon_all();
  } catch (const std::exception& e) {  // a ZeroMQ error: nothing is left to free
    log("while unwinding, abandoning the ps requests failed too: ", e.what());
  }
}

Precision apply_precision(Backend& backend, Precision wanted) {
  Precision used = wanted;
  if (const std::string why = backend.precision_unavailable(wanted); !why.empty()) {
    used = Precision::fp32;
    log("train.precision=", to_string(wanted), " is not available on ", backend.name(), ": ", why,
        "; training in ", to_string(used));
  }
  backend.set_precision(used);
  return used;
}

bool scales_loss(const ClusterConfig& config, const Backend& backend) {
  return config.train.precision == Precision::fp16 &&
         backend.precision_unavailable(Precision::fp16).empty();
}

std::string describe_paths(const PathCounts& paths) {
  std::string text;
  for (const auto& [path, count] : paths)
    text += (text.empty() ? "" : ", ") + path + " " + std::to_string(count);
  return text.empty() ? "none counted" : text;
}

bool records_steps(const ClusterConfig& config, const Backend& backend) {
  return config.train.cuda_graphs && backend.records_steps() &&
         config.train.precision == Precision::fp32 && config.train.accumulate_steps == 1;
}

StepGraphs::StepGraphs(Backend& backend, int batch_size, std::string what, Work work)
    : backend_(backend), batch_size_(batch_size), what_(std::move(what)), work_(std::move(work)) {}

StepGraphs::Ran StepGraphs::run(int n, const StepScalars& scalars) {
  if (n != batch_size_ || failed_ || !warmed_up_) {
    warmed_up_ = warmed_up_ || n == batch_size_;
    work_(n, scalars);
    return Ran::eager;
  }
  if (graph_) {
    graph_->run(scalars);
    return Ran::replayed;
  }
  try {
    graph_ = backend_.make_step_graph([this, n](const StepScalars& s) { work_(n, s); });
    graph_->run(scalars);
    return Ran::recorded;
  } catch (const std::exception& e) {
    // Nothing of the step was issued: it runs eagerly, as all later ones.
    graph_.reset();
    failed_ = true;
    log("train.cuda_graphs: recording the ", what_, " of a batch of ", n, " on ", backend_.name(),
        " failed (", e.what(), "); its steps run eagerly");
    work_(n, scalars);
    return Ran::eager;
  }
}

GradAccumulator::GradAccumulator(Backend& backend, Model& model, std::uint32_t steps,
                                 int record_batch)
    : backend_(backend), model_(model) {
  if (record_batch > 0) {
    if (steps > 1)
      throw std::invalid_argument("recorded steps take one micro-batch each, not " +
                                  std::to_string(steps));
    graphs_.emplace(
        backend, record_batch, "forward and backward",
        [&model](int n, const StepScalars&) { model.forward_backward(n, [](std::size_t) {}); });
  }
  if (steps < 2) return;
  for (const auto& v : model.variables()) sums_.push_back(backend.alloc(v.size * sizeof(float)));
}

void GradAccumulator::add(int n) {
  const auto& vars = model_.variables();
  const float weight = static_cast<float>(n) / model_.loss_scale();
  model_.forward_backward(n, [&](std::size_t i) {
    backend_.axpby(weight, model_.grad(i).data(), samples_ > 0 ? 1.0f : 0.0f, sums_.at(i).data(),
                   vars[i].size);
  });
  samples_ += n;
}

void GradAccumulator::finish(int n,
                             const std::function<void(std::size_t variable)>& on_grad_issued) {
  const auto& vars = model_.variables();
  if (graphs_) {
    graphs_->run(n, {});
    for (std::size_t i = vars.size(); i-- > 0;) on_grad_issued(i);
    return;
  }
  const double total = samples_ + n;
  const double scale = model_.loss_scale();
  model_.forward_backward(n, [&](std::size_t i) {
    if (samples_ > 0)
      backend_.axpby(static_cast<float>(1 / total), sums_[i].data(),
                     static_cast<float>(n / (total * scale)), model_.grad(i).data(), vars[i].size);
    else if (scale != 1)
      backend_.scale(model_.grad(i).data(), static_cast<float>(1 / scale), vars[i].size);
    on_grad_issued(i);
  });
  samples_ = 0;
}

BatchFeeder::BatchFeeder(Backend& backend, Model& model, WorkerShard& shard, std::size_t batch_size)
    : backend_(backend),
      model_(model),
      shard_(shard),
      batch_size_(batch_size),
      direct_(backend.host_accessible()),
      losses_(model.loss_buffer()) {
  if (direct_) return;
  const std::size_t sample_floats = shard.data().sample_floats();
  for (auto& s : staged_) {
    s.images = backend.alloc_host(batch_size * sample_floats * sizeof(float));
    s.labels = backend.alloc_host(batch_size * sizeof(std::int32_t));
  }
  host_loss_ = backend.alloc_host(batch_size * sizeof(float));
  losses_ = host_loss_.data();
}

Batch BatchFeeder::load() {
  if (direct_) {
    const Batch b = shard_.next_batch(batch_size_, model_.input_buffer(), model_.label_buffer());
    last_ = b.size;
    return b;
  }
  Staged& s = staged_[next_];
  if (!s.ready) {
    s.batch = shard_.next_batch(batch_size_, s.images.data(), s.labels.data<std::int32_t>());
  }
  // The other buffer's upload was issued a step ago and has completed (every
  // step ends with a fence), so stage_next may refill it now.
  s.ready = false;
  next_ ^= 1;
  last_ = s.batch.size;
  backend_.upload(s.images.data(), model_.input_buffer(),
                  s.batch.size * shard_.data().sample_floats() * sizeof(float));
  backend_.upload(s.labels.data(), model_.label_buffer(), s.batch.size * sizeof(std::int32_t));
  return s.batch;
}

void BatchFeeder::stage_next() {
  if (direct_) return;
  Staged& s = staged_[next_];
  if (s.ready) return;
  s.batch = shard_.next_batch(batch_size_, s.images.data(), s.labels.data<std::int32_t>());
  s.ready = true;
}

void BatchFeeder::fetch_losses() {
  if (!direct_) backend_.download(model_.loss_buffer(), host_loss_.data(), last_ * sizeof(float));
}

double BatchFeeder::mean_loss() const {
  double loss = 0;
  for (std::size_t s = 0; s < last_; ++s) loss += losses_[s];
  return loss / static_cast<double>(last_);
}

namespace {

// Step phases take from a tenth of a millisecond (a small model on a GPU) to
// seconds (a straggler, a slow network).
const std::vector<double> kStepSeconds = log_bounds(1e-4, 10);

}  // namespace

ProgressReporter::ProgressReporter(const TrainContext& context)
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
      loss_mean_(loss_) {}

void ProgressReporter::step(std::size_t samples, double loss, double compute_s) {
  steps_.add();
  samples_.add(static_cast<double>(samples));
  loss_.observe(loss);
  compute_.observe(compute_s);
}

Histogram& ProgressReporter::mean(std::string field, std::string name, std::string help,
                                  std::vector<double> bounds, double scale) {
  auto& h = context_.registry.histogram(std::move(name), std::move(help), std::move(bounds)).with();
  figures_.push_back({std::move(field), [window = WindowedMean(h), scale]() mutable {
                        return window.take() * scale;
                      }});
  return h;
}

Histogram& ProgressReporter::mean_ms(std::string field, std::string name, std::string help) {
  return mean(std::move(field), std::move(name), std::move(help), kStepSeconds, 1e3);
}

Gauge& ProgressReporter::max(std::string field, std::string name, std::string help) {
  auto& g = context_.registry.gauge(std::move(name), std::move(help)).with();
  figures_.push_back({std::move(field), [&g] { return g.reset(); }});
  return g;
}

Counter& ProgressReporter::total(std::string field, std::string name, std::string help) {
  auto& c = context_.registry.counter(std::move(name), std::move(help)).with();
  figures_.push_back({std::move(field), [&c] { return c.value(); }});
  return c;
}

void ProgressReporter::end_step(bool last) {
  if (straggler_)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(straggler_delay_ms(
        context_.config.train, context_.index, static_cast<std::uint64_t>(steps_.value()))));
  if (last || std::chrono::duration<double>(Clock::now() - last_heartbeat_).count() >= heartbeat_s_)
    report();
}

void ProgressReporter::report() {
  const double samples = samples_.value();
  const auto window_samples = static_cast<std::uint64_t>(samples - window_samples_);
  // A report that fails (ps 0 restarting, a reply lost) does not stop
  // training: its samples go with the next one, and the data requests
  // tell whether the ps is really gone.
  auto global = static_cast<std::uint64_t>(global_samples_.value());
  try {
    global = context_.ps.report_samples(static_cast<std::uint64_t>(samples - reported_));
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
  context_.metrics.write(line);
  if (context_.hook) context_.hook(global, epoch, loss, global_rate);
  window_start_ = Clock::now();
  window_samples_ = samples;
}

TrainSummary ProgressReporter::finish() {
  return {static_cast<std::uint64_t>(samples_.value()),
          static_cast<std::uint64_t>(global_samples_.value()),
          static_cast<std::uint64_t>(steps_.value()),
          std::chrono::duration<double>(Clock::now() - start_).count()};
}

}  // namespace pstrain
