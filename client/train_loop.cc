#include "client/train_loop.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "client/model.h"
#include "client/ps_client.h"

namespace pstrain {

std::uint64_t total_steps(const ClusterConfig& config, const WorkerShard& shard) {
  const auto batches = shard.batches_per_epoch(config.train.batch_size);
  return static_cast<std::uint64_t>(
      std::ceil(config.train.epochs * static_cast<double>(batches)));
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

BatchFeeder::BatchFeeder(Backend& backend, Model& model, WorkerShard& shard,
                         std::size_t batch_size)
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
  if (!direct_)
    backend_.download(model_.loss_buffer(), host_loss_.data(), last_ * sizeof(float));
}

double BatchFeeder::mean_loss() const {
  double loss = 0;
  for (std::size_t s = 0; s < last_; ++s) loss += losses_[s];
  return loss / static_cast<double>(last_);
}

ProgressReporter::ProgressReporter(const ClusterConfig& config, std::uint32_t index,
                                   PsClient& ps, const WorkerShard& shard,
                                   MetricsFile& metrics, const ProgressHook& hook)
    : config_(config),
      index_(index),
      ps_(ps),
      shard_(shard),
      metrics_(metrics),
      hook_(hook),
      // Worker 0's heartbeats also pace evaluations and progress, so it
      // reports more often than liveness alone needs.
      heartbeat_s_(index == 0 ? std::min(config.net.heartbeat, 0.25) : config.net.heartbeat),
      straggler_(config.train.straggler_worker == static_cast<int>(index) &&
                 config.train.straggler_delay_ms > 0) {}

void ProgressReporter::step(std::size_t samples, double loss, double compute_ms) {
  loss_ += loss;
  compute_ms_ += compute_ms;
  steps_ += 1;
  samples_ += samples;
  summary_.local_samples += samples;
  summary_.steps += 1;
  unreported_ += samples;
}

ProgressReporter::Figure& ProgressReporter::figure(const std::string& name, bool max) {
  auto it = std::ranges::find(figures_, name, &Figure::name);
  if (it != figures_.end()) return *it;
  return figures_.emplace_back(Figure{name, 0, max});
}

void ProgressReporter::add_mean(const std::string& name, double value) {
  figure(name, false).value += value;
}

void ProgressReporter::add_max(const std::string& name, double value) {
  auto& f = figure(name, true);
  f.value = std::max(f.value, value);
}

void ProgressReporter::end_step(bool last) {
  if (straggler_)
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(config_.train.straggler_delay_ms));
  if (last || std::chrono::duration<double>(Clock::now() - last_heartbeat_).count() >= heartbeat_s_)
    report();
}

void ProgressReporter::report() {
  summary_.global_samples = ps_.heartbeat(unreported_);
  unreported_ = 0;
  last_heartbeat_ = Clock::now();
  const auto window = std::chrono::duration<double>(std::max(5.0, 5 * config_.net.heartbeat));
  global_history_.emplace_back(last_heartbeat_, summary_.global_samples);
  while (global_history_.size() > 2 && last_heartbeat_ - global_history_[1].first >= window)
    global_history_.pop_front();
  const double steps = static_cast<double>(steps_);
  const double epoch =
      static_cast<double>(summary_.local_samples) / static_cast<double>(shard_.size());
  const double local_rate = static_cast<double>(samples_) /
                            std::chrono::duration<double>(Clock::now() - window_start_).count();
  const auto& [oldest_time, oldest_samples] = global_history_.front();
  const double span = std::chrono::duration<double>(last_heartbeat_ - oldest_time).count();
  const double global_rate =
      global_history_.size() < 2 || span <= 0
          ? local_rate
          : static_cast<double>(summary_.global_samples - oldest_samples) / span;
  JsonObject line;
  line.add("role", "worker")
      .add("index", static_cast<int>(index_))
      .add("step", summary_.steps)
      .add("epoch", epoch)
      .add("local_samples", summary_.local_samples)
      .add("global_samples", summary_.global_samples)
      .add("loss", loss_ / steps)
      .add("samples_per_s", local_rate)
      .add("global_samples_per_s", global_rate)
      .add("compute_ms", compute_ms_ / steps);
  for (auto& f : figures_) {
    line.add(f.name, f.max ? f.value : f.value / steps);
    f.value = 0;
  }
  metrics_.write(line);
  if (hook_) hook_(summary_.global_samples, epoch, loss_ / steps, global_rate);
  window_start_ = Clock::now();
  loss_ = compute_ms_ = 0;
  steps_ = samples_ = 0;
}

TrainSummary ProgressReporter::finish() {
  summary_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  return summary_;
}

}  // namespace pstrain
