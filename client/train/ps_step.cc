#include "client/train/ps_step.h"

#include <algorithm>
#include <functional>
#include <span>

#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/ps/ps_restarts.h"
#include "client/train/backend_setup.h"
#include "shared/all_finite.h"
#include "shared/trace.h"

namespace pstrain {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

PsStep::PsStep(const TrainContext& context, StepMetrics& metrics)
    : context_(context),
      host_(context.backend, context.model, true),
      pipelined_(context.config.train.pipeline > 0),
      predictor_(pipelined_ ? context.model.variables().size() : 0,
                 static_cast<float>(context.config.train.weight_prediction)),
      requests_(context.ps),
      // Forward and backward replayed from a CUDA graph where steps are
      // recorded (train.cuda_graphs): the gradients' downloads then follow
      // the whole backward instead of each layer's, which the saved launches
      // more than pay for on a GPU.
      accumulator_(context.backend, context.model, context.config.train.accumulate_steps,
                   recorded_batch(context.config, context.backend)),
      push_pull_(metrics.mean_ms(
          "push_pull_ms", "pstrain_worker_push_pull_seconds",
          "Time from a step's first gradient sent to its last new weights received.")),
      wait_(metrics.mean_ms("wait_ms", "pstrain_worker_wait_seconds",
                            "Time per step waiting for the ps's replies after the compute.")),
      staleness_(metrics.mean(
          "staleness", "pstrain_worker_staleness",
          "Updates other workers applied between a pull and its push, mean over the variables.",
          {0, 1, 2, 4, 8, 16, 32, 64, 128})),
      max_staleness_(metrics.max("max_staleness", "pstrain_worker_staleness_window_max",
                                 "Largest staleness since the last metrics line.")),
      kept_messages_(metrics.max(
          "kept_messages", "pstrain_worker_kept_reply_messages",
          "Replies' ZeroMQ messages kept to be read in place (train.pipeline) after a step's "
          "landing, most since the last metrics line: at most one step's chunks.")),
      ps_restarts_(context.registry
                       .counter("pstrain_worker_ps_restarts_total",
                                "Times this worker found servers restarted, said hello "
                                "again and re-pulled.")
                       .with()) {
  // fp16: a step's gradients go out only once all of them are known to be
  // finite (an overflow skips the step), so none is sent during backward.
  if (scales_loss(context.config, context.backend)) scaler_.emplace(context.registry);
  if (pipelined_) {
    for (auto& f : flights_) {
      for (const auto& v : context.model.variables()) {
        f.grads.emplace_back(v.size);
        f.weights.emplace_back(static_cast<std::size_t>(v.size));
        f.versions.emplace_back(context.ps.chunk_count(v.name));
      }
    }
  }
}

void PsStep::pull_all() {
  const auto& vars = context_.model.variables();
  for (std::size_t i = 0; i < vars.size(); ++i) context_.ps.pull(vars[i].name, host_.weights(i));
  context_.ps.wait_all();
  predictor_.forget();
  upload_weights();
}

void PsStep::upload_weights() {
  if (host_.direct()) return;
  for (std::size_t i = 0; i < context_.model.variables().size(); ++i)
    context_.backend.upload(host_.weights(i).data(), context_.model.param(i).data(),
                            host_.weights(i).size_bytes());
}

std::uint64_t PsStep::start(std::uint64_t resume_step) {
  context_.ps.set_clock(resume_step);
  pull_all();
  return resume_step;
}

void PsStep::begin(std::uint64_t step) {
  // This step's pushes; their replies are the next step's weights, which a
  // ps in mode ssp holds until the slowest worker is near enough.
  context_.ps.set_clock(step);
  step_ = step;
  if (rejoin_restarted_servers(context_.ps)) {
    ps_restarts_.add();
    // The requests still in flight are answered (resent where needed);
    // the re-pull is newer than what they bring.
    await([this] { context_.ps.wait_all(); });
    for (auto& f : flights_) {
      f.sent.clear();
      f.tickets.clear();
      f.first_send = {};
      for (auto& w : f.weights) w.release();
    }
    pull_all();
  }
  if (scaler_) context_.model.set_loss_scale(scaler_->scale());
  first_send_ = {};
}

void PsStep::accumulate(int n) { accumulator_.add(n); }

void PsStep::send(std::size_t variable) {
  if (first_send_ == Clock::time_point{}) first_send_ = Clock::now();
  const auto& name = context_.model.variables()[variable].name;
  const TraceSpan span("send", "comm", name);
  if (!pipelined_) {
    context_.ps.push_pull(name, host_.grads(variable), host_.weights(variable));
    return;
  }
  // The next step's backward writes the model's gradients while this one's
  // are still being sent.
  InFlight& f = flights_[step_ & 1];
  if (f.first_send == Clock::time_point{}) f.first_send = Clock::now();
  std::ranges::copy(host_.grads(variable), f.grads[variable].begin());
  f.sent.push_back(variable);
  f.tickets.push_back(
      context_.ps.push_pull(name, f.grads[variable], f.weights[variable], f.versions[variable]));
}

void PsStep::land(InFlight& f, bool predict) {
  for (const auto ticket : f.tickets) context_.ps.wait(ticket);
  if (f.first_send != Clock::time_point{}) push_pull_.observe(seconds_since(f.first_send));
  f.first_send = {};
  const TraceSpan span("copy weights", "comm");
  // A step that sent nothing (fp16: an overflow): the next landing's change
  // would span two steps, so it is not continued.
  if (f.sent.empty()) predictor_.forget();
  for (const std::size_t v : f.sent) {
    predictor_.land(v, f.weights[v].pieces(), host_.weights(v), predict);
    f.weights[v].release();  // the messages the values came in
    context_.ps.adopt_versions(context_.model.variables()[v].name, f.versions[v]);
  }
  f.sent.clear();
  f.tickets.clear();
}

void PsStep::await(const std::function<void()>& wait) {
  try {
    wait();
  } catch (const PsError&) {
    // A ps that restarted without its checkpoint answers with errors (it
    // has no chunks): say that rather than what the errors say.
    rejoin_restarted_servers(context_.ps);
    throw;
  }
}

void PsStep::grad_issued(std::size_t variable) {
  const auto issued = [&](std::size_t i) {
    if (!scaler_) send(i);
  };
  if (host_.direct()) return issued(variable);
  const auto grad = host_.grads(variable);
  context_.backend.download(context_.model.grad(variable).data(), grad.data(), grad.size_bytes());
  pending_.push_back({variable, context_.backend.fence()});
  while (!pending_.empty() && context_.backend.fence_done(pending_.front().fence)) {
    issued(pending_.front().variable);
    pending_.pop_front();
  }
}

void PsStep::issue(std::uint64_t, int n) {
  accumulator_.finish(n, [this](std::size_t i) { grad_issued(i); });
}

void PsStep::finish(std::uint64_t, bool last) {
  auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context_;
  const std::size_t nv = model.variables().size();
  if (!host_.direct()) {
    for (; !pending_.empty(); pending_.pop_front()) {
      backend.wait(pending_.front().fence);
      if (!scaler_) send(pending_.front().variable);
    }
    backend.synchronize();
  }
  if (scaler_) {
    bool finite = true;
    for (std::size_t i = 0; i < nv && finite; ++i) finite = all_finite(host_.grads(i));
    if (scaler_->update(finite))
      for (std::size_t i = nv; i-- > 0;) send(i);
  }
  const auto t_wait = Clock::now();
  {
    const TraceSpan span("wait for replies", "comm");
    await([&] {
      if (!pipelined_) return context_.ps.wait_all();
      // The step before's replies: the weights the next step computes on.
      // The last step also waits for its own.
      land(flights_[(step_ + 1) & 1], !last);
      if (last) land(flights_[step_ & 1], false);
    });
  }
  {
    const TraceSpan upload("upload weights", "comm");
    upload_weights();
  }

  double stale = 0;
  for (const auto& v : model.variables()) stale += ps.last_staleness(v.name);
  stale /= static_cast<double>(nv);
  // Pipelined, land() times each step's requests from its first send.
  if (!pipelined_ && first_send_ != Clock::time_point{})
    push_pull_.observe(seconds_since(first_send_));
  wait_.observe(seconds_since(t_wait));
  staleness_.observe(stale);
  max_staleness_.raise(stale);
  kept_messages_.raise(static_cast<double>(ReceivedValues::kept_in_process()));
}

void PsStep::end() { context_.ps.finished_pushing(); }

}  // namespace pstrain
