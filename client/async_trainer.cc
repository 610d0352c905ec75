#include "client/async_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <span>
#include <thread>
#include <vector>

#include "client/backend.h"
#include "client/model.h"
#include "client/ps_client.h"
#include "shared/log.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Sums and counts over a metrics window.
struct Window {
  double loss = 0, compute_ms = 0, wait_ms = 0, comm_ms = 0, staleness = 0,
         max_staleness = 0;
  std::uint64_t steps = 0, samples = 0;
  Clock::time_point start = Clock::now();
};

}  // namespace

AsyncTrainer::AsyncTrainer(const ClusterConfig& config, std::uint32_t index,
                           Backend& backend, Model& model, PsClient& ps,
                           WorkerShard& shard, MetricsFile& metrics)
    : config_(config), index_(index), backend_(backend), model_(model), ps_(ps),
      shard_(shard), metrics_(metrics) {}

TrainSummary AsyncTrainer::run() {
  const auto& vars = model_.variables();
  const std::size_t nv = vars.size();
  const std::size_t batch = config_.train.batch_size;
  const bool direct = backend_.host_accessible();

  // Host views of every variable's weights and gradient: the backend's own
  // memory when the host can reach it, else pinned staging buffers.
  std::vector<HostMemory> staging;
  std::vector<std::span<float>> weights(nv), grads(nv);
  for (std::size_t i = 0; i < nv; ++i) {
    const std::size_t n = vars[i].size;
    if (direct) {
      weights[i] = {model_.param(i).data(), n};
      grads[i] = {model_.grad(i).data(), n};
    } else {
      staging.push_back(backend_.alloc_host(n * sizeof(float)));
      weights[i] = {staging.back().data(), n};
      staging.push_back(backend_.alloc_host(n * sizeof(float)));
      grads[i] = {staging.back().data(), n};
    }
  }
  const std::size_t sample_floats = shard_.data().sample_floats();
  HostMemory host_images, host_labels, host_loss;
  float* images = model_.input_buffer();
  std::int32_t* labels = model_.label_buffer();
  const float* losses = model_.loss_buffer();
  if (!direct) {
    host_images = backend_.alloc_host(batch * sample_floats * sizeof(float));
    host_labels = backend_.alloc_host(batch * sizeof(std::int32_t));
    host_loss = backend_.alloc_host(batch * sizeof(float));
    images = host_images.data();
    labels = host_labels.data<std::int32_t>();
    losses = host_loss.data();
  }

  const auto batches_per_epoch = shard_.batches_per_epoch(batch);
  const auto total_steps = static_cast<std::uint64_t>(
      std::ceil(config_.train.epochs * static_cast<double>(batches_per_epoch)));
  const bool straggler = config_.train.straggler_worker == static_cast<int>(index_) &&
                         config_.train.straggler_delay_ms > 0;
  const auto delay = std::chrono::duration<double, std::milli>(config_.train.straggler_delay_ms);
  // Worker 0's heartbeats also pace evaluations and progress, so it reports
  // more often than liveness alone needs.
  const double heartbeat_s =
      index_ == 0 ? std::min(config_.net.heartbeat, 0.25) : config_.net.heartbeat;

  for (std::size_t i = 0; i < nv; ++i) ps_.pull(vars[i].name, weights[i]);
  ps_.wait_all();

  TrainSummary summary;
  Window window;
  std::uint64_t unreported = 0;
  auto last_heartbeat = Clock::now();
  const auto start = Clock::now();
  struct Pending {
    std::size_t variable;
    Backend::Fence fence;
  };
  std::deque<Pending> pending;

  for (std::uint64_t step = 0; step < total_steps; ++step) {
    const Batch b = shard_.next_batch(batch, images, labels);
    const int n = static_cast<int>(b.size);
    if (!direct) {
      for (std::size_t i = 0; i < nv; ++i)
        backend_.upload(weights[i].data(), model_.param(i).data(), weights[i].size_bytes());
      backend_.upload(images, model_.input_buffer(), b.size * sample_floats * sizeof(float));
      backend_.upload(labels, model_.label_buffer(), b.size * sizeof(std::int32_t));
    }

    const auto t_compute = Clock::now();
    Clock::time_point t_first_send{};
    auto send = [&](std::size_t i) {
      if (t_first_send == Clock::time_point{}) t_first_send = Clock::now();
      ps_.push_pull(vars[i].name, grads[i], weights[i]);
    };
    model_.forward_backward(n, [&](std::size_t i) {
      if (direct) return send(i);
      backend_.download(model_.grad(i).data(), grads[i].data(), grads[i].size_bytes());
      pending.push_back({i, backend_.fence()});
      while (!pending.empty() && backend_.fence_done(pending.front().fence)) {
        send(pending.front().variable);
        pending.pop_front();
      }
    });
    if (!direct) {
      backend_.download(model_.loss_buffer(), host_loss.data(), b.size * sizeof(float));
      for (; !pending.empty(); pending.pop_front()) {
        backend_.wait(pending.front().fence);
        send(pending.front().variable);
      }
      backend_.synchronize();
    }
    const auto t_wait = Clock::now();
    ps_.wait_all();

    double loss = 0;
    for (int s = 0; s < n; ++s) loss += losses[s];
    double staleness = 0;
    for (const auto& v : vars) staleness += ps_.last_staleness(v.name);
    staleness /= static_cast<double>(nv);

    window.loss += loss / n;
    window.compute_ms += std::chrono::duration<double, std::milli>(t_wait - t_compute).count();
    window.wait_ms += ms_since(t_wait);
    window.comm_ms += ms_since(t_first_send);
    window.staleness += staleness;
    window.max_staleness = std::max(window.max_staleness, staleness);
    window.steps += 1;
    window.samples += b.size;
    summary.local_samples += b.size;
    summary.steps += 1;
    summary.last_loss = loss / n;
    unreported += b.size;

    if (straggler) std::this_thread::sleep_for(delay);

    const bool last = step + 1 == total_steps;
    if (last || std::chrono::duration<double>(Clock::now() - last_heartbeat).count() >= heartbeat_s) {
      const std::uint64_t previous = summary.global_samples;
      const double interval = std::chrono::duration<double>(Clock::now() - last_heartbeat).count();
      summary.global_samples = ps_.heartbeat(unreported);
      unreported = 0;
      last_heartbeat = Clock::now();
      const double steps = static_cast<double>(window.steps);
      const double epoch = static_cast<double>(summary.local_samples) /
                           static_cast<double>(shard_.size());
      const double local_rate = static_cast<double>(window.samples) /
                                std::chrono::duration<double>(Clock::now() - window.start).count();
      const double global_rate =
          previous == 0 ? local_rate
                        : static_cast<double>(summary.global_samples - previous) / interval;
      metrics_.write(JsonObject()
                         .add("role", "worker")
                         .add("index", static_cast<int>(index_))
                         .add("step", summary.steps)
                         .add("epoch", epoch)
                         .add("local_samples", summary.local_samples)
                         .add("global_samples", summary.global_samples)
                         .add("loss", window.loss / steps)
                         .add("samples_per_s", local_rate)
                         .add("global_samples_per_s", global_rate)
                         .add("compute_ms", window.compute_ms / steps)
                         .add("push_pull_ms", window.comm_ms / steps)
                         .add("wait_ms", window.wait_ms / steps)
                         .add("staleness", window.staleness / steps)
                         .add("max_staleness", window.max_staleness));
      if (hook_) hook_(summary.global_samples, epoch, window.loss / steps, global_rate);
      window = Window{};
    }
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace pstrain
