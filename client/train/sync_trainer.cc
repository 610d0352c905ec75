#include "client/train/sync_trainer.h"

#include <chrono>
#include <optional>
#include <span>

#include "client/comm/communicator_factory.h"
#include "client/comm/rendezvous.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "shared/log.h"
#include "shared/modes.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

std::vector<GradientBucket> gradient_buckets(const std::vector<VariableSpec>& vars,
                                             std::size_t bucket_bytes) {
  std::vector<GradientBucket> buckets;
  std::size_t bytes = 0;
  for (std::size_t i = vars.size(); i-- > 0;) {
    if (buckets.empty() || bytes >= bucket_bytes) {
      buckets.push_back({i, i, 0});
      bytes = 0;
    }
    buckets.back().first_variable = i;
    buckets.back().count += vars[i].size;
    bytes += vars[i].size * sizeof(float);
  }
  return buckets;
}

float sync_lr_scale(const TrainConfig& train, int workers, std::uint64_t step) {
  // The rule scales with the effective batch: workers x accumulated micro-batches.
  const double target =
      train.lr_scaling ? static_cast<double>(workers) * train.accumulate_steps : 1.0;
  if (step >= train.warmup_steps) return static_cast<float>(target);
  const double start = train.lr_scaling ? 1.0 : 0.0;
  return static_cast<float>(start + (target - start) * static_cast<double>(step) /
                                        static_cast<double>(train.warmup_steps));
}

SyncReplica::SyncReplica(Backend& backend, Model& model, Communicator& comm,
                         const OptimizerConfig& optimizer, std::size_t bucket_bytes, bool overlap,
                         std::uint32_t local_steps, std::uint32_t accumulate_steps,
                         int record_batch)
    : backend_(backend),
      model_(model),
      comm_(comm),
      optimizer_(optimizer),
      slots_(Optimizer(optimizer).state_slots()),
      enqueued_(!backend.host_accessible()),
      overlap_(overlap && backend.host_accessible() && local_steps == 0),
      local_steps_(local_steps),
      accumulator_(backend, model, accumulate_steps, record_batch) {
  const auto& vars = model.variables();
  std::size_t total = 0;
  for (const auto& v : vars) {
    offset_.push_back(total);
    total += v.size;
  }

  // Where the optimizer finds each gradient: the model's, in local SGD;
  // else its place in its bucket, which the all-reduce sums in place.
  std::vector<float*> grads;
  for (std::size_t i = 0; i < vars.size(); ++i) grads.push_back(model.grad(i).data());
  if (local_steps == 0) {
    bucket_of_.resize(vars.size());
    in_bucket_.resize(vars.size());
    for (const GradientBucket& plan : gradient_buckets(vars, bucket_bytes)) {
      Bucket& b = buckets_.emplace_back(plan, backend.alloc(plan.count * sizeof(float)));
      float* at = b.data();
      for (std::size_t i = plan.first_variable; i <= plan.last_variable; ++i) {
        grads[i] = in_bucket_[i] = at;
        at += vars[i].size;
        bucket_of_[i] = buckets_.size() - 1;
      }
    }
  }

  // State starts as the optimizer says (zeros, or Adagrad's accumulator).
  if (slots_ > 0) {
    std::vector<float> initial(total * slots_);
    Optimizer(optimizer).init_state(initial);
    state_ = backend.alloc(initial.size() * sizeof(float));
    backend.upload(initial.data(), state_.data(), initial.size() * sizeof(float));
    backend.synchronize();
  }
  for (std::size_t i = 0; i < vars.size(); ++i)
    tensors_.push_back({model.param(i).data(), grads[i],
                        slots_ > 0 ? state_.data() + offset_[i] * slots_ : nullptr, vars[i].size});
  if (record_batch > 0)
    optimizer_graphs_.emplace(backend, 0, "optimizer step",
                              [this](int, const StepScalars& s) { apply_optimizer(s); });
  if (overlap_) thread_ = std::jthread([this](std::stop_token stop) { communicate(stop); });
}

void SyncReplica::optimize(const StepScalars& scalars) {
  if (optimizer_graphs_)
    optimizer_graphs_->run(0, scalars);
  else
    apply_optimizer(scalars);
}

void SyncReplica::apply_optimizer(const StepScalars& scalars) {
  // Sync averages the all-reduced buckets first; local SGD steps on its own
  // gradients.
  if (local_steps_ == 0) {
    const float average = 1.0f / static_cast<float>(comm_.size());
    for (const Bucket& b : buckets_) backend_.scale(b.data(), average, b.plan.count);
  }
  backend_.apply_optimizers(optimizer_, tensors_, scalars.step, scalars.lr_scale);
}

void SyncReplica::reduce(std::size_t bucket) {
  comm_.allreduce_sum(buckets_[bucket].data(), buckets_[bucket].plan.count);
}

void SyncReplica::communicate(std::stop_token stop) {
  while (true) {
    std::size_t bucket;
    {
      std::unique_lock lock(mutex_);
      if (!cv_.wait(lock, stop, [&] { return !queue_.empty(); })) return;
      bucket = queue_.front();
      queue_.pop_front();
    }
    const auto t = Clock::now();
    std::exception_ptr error;
    try {
      reduce(bucket);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      allreduce_ms_ += ms_between(t, Clock::now());
      reduced_ += 1;
      if (error && !error_) error_ = error;
    }
    cv_.notify_all();
  }
}

void SyncReplica::enqueue(std::size_t bucket) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(bucket);
  }
  cv_.notify_all();
}

void SyncReplica::wait_reduced() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return reduced_ == buckets_.size(); });
  if (error_) std::rethrow_exception(error_);
}

void SyncReplica::accumulate(int n) {
  if (scaler_) model_.set_loss_scale(scaler_->scale());
  accumulator_.add(n);
}

SyncStepTimes SyncReplica::local_step(int n, float lr_scale) {
  SyncStepTimes times;
  const auto& vars = model_.variables();
  const auto t_compute = Clock::now();
  if (scaler_) model_.set_loss_scale(scaler_->scale());
  accumulator_.finish(n, [](std::size_t) {});
  const auto t_optimizer = Clock::now();
  times.compute_ms = ms_between(t_compute, t_optimizer);
  bool finite = true;
  for (std::size_t i = 0; scaler_ && i < vars.size() && finite; ++i)
    finite = backend_.all_finite(model_.grad(i).data(), vars[i].size);
  // A skipped step still counts towards the average, which every replica
  // must reach at the same step.
  steps_ += 1;
  if (!scaler_ || scaler_->update(finite)) optimize({steps_, lr_scale});
  const auto t_average = Clock::now();
  times.optimizer_ms = ms_between(t_optimizer, t_average);
  if (steps_ % local_steps_ == 0) {
    average_weights();
    // Nothing overlaps the average: all of it is waited for.
    times.allreduce_ms = times.wait_ms = ms_between(t_average, Clock::now());
  }
  return times;
}

void SyncReplica::average_weights() {
  const auto& vars = model_.variables();
  const float average = 1.0f / static_cast<float>(comm_.size());
  for (std::size_t i = 0; i < vars.size(); ++i) {
    comm_.allreduce_sum(model_.param(i).data(), vars[i].size);
    backend_.scale(model_.param(i).data(), average, vars[i].size);
  }
}

SyncStepTimes SyncReplica::step(int n, float lr_scale) {
  if (local_steps_ > 0) return local_step(n, lr_scale);
  SyncStepTimes times;
  const auto& vars = model_.variables();
  {
    std::lock_guard lock(mutex_);
    reduced_ = 0;
    allreduce_ms_ = 0;
  }
  const auto t_compute = Clock::now();
  if (scaler_) model_.set_loss_scale(scaler_->scale());
  accumulator_.finish(n, [&](std::size_t i) {
    // Into its bucket, behind the work that wrote it (axpby with a = 1 and
    // b = 0 copies exactly, on the backend's own stream).
    backend_.axpby(1.0f, model_.grad(i).data(), 0.0f, in_bucket_[i], vars[i].size);
    const std::size_t b = bucket_of_[i];
    if (buckets_[b].plan.first_variable != i) return;  // the bucket is not full yet
    if (overlap_) return enqueue(b);
    if (enqueued_) {  // NCCL: queued on its stream behind the copies, overlapping the rest
      const auto t = Clock::now();
      reduce(b);
      times.allreduce_ms += ms_between(t, Clock::now());
    }
  });
  comm_.mark();  // the end of backward, for communicators that time on the device
  const auto t_backward = Clock::now();
  times.compute_ms = ms_between(t_compute, t_backward);
  if (overlap_) {
    wait_reduced();
    times.allreduce_ms = allreduce_ms_;
  } else if (!enqueued_) {
    for (std::size_t b = 0; b < buckets_.size(); ++b) reduce(b);
    times.allreduce_ms = ms_between(t_backward, Clock::now());
  }
  const auto t_reduced = Clock::now();
  times.wait_ms = ms_between(t_backward, t_reduced);
  if (scaler_) {
    bool finite = true;
    for (std::size_t b = 0; b < buckets_.size() && finite; ++b)
      finite = backend_.all_finite(buckets_[b].data(), buckets_[b].plan.count);
    if (!scaler_->update(finite)) return times;
  }

  steps_ += 1;
  optimize({steps_, lr_scale});
  times.optimizer_ms = ms_between(t_reduced, Clock::now());
  return times;
}

TrainSummary train_sync(const TrainContext& context) {
  auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context;
  const auto& vars = model.variables();
  const std::size_t nv = vars.size();
  // Host views of the weights, for pulling and assigning.
  const HostViews host(backend, model, false);
  const PsRequestsGuard requests(ps);
  const bool direct = host.direct();
  auto weights = [&](std::size_t i) { return host.weights(i); };
  // Every replica of an attempt starts from the ps's weights, so they agree
  // from its first step.
  const auto read_from_ps = [&] {
    for (std::size_t i = 0; i < nv; ++i) ps.pull(vars[i].name, weights(i));
    ps.wait_all();
    if (!direct) {
      for (std::size_t i = 0; i < nv; ++i)
        backend.upload(weights(i).data(), model.param(i).data(), weights(i).size_bytes());
      backend.synchronize();
    }
  };
  const auto write_to_ps = [&](std::uint64_t step) {
    if (!direct) {
      for (std::size_t i = 0; i < nv; ++i)
        backend.download(model.param(i).data(), weights(i).data(), weights(i).size_bytes());
      backend.synchronize();
    }
    for (std::size_t i = 0; i < nv; ++i) ps.assign(vars[i].name, weights(i));
    ps.wait_all();
    // Only once every chunk is there: a restart resumes from these weights.
    record_sync_step(ps, config, step);
  };

  const std::uint64_t steps = optimizer_steps(config, shard);
  const std::uint32_t accumulate_steps = config.train.accumulate_steps;
  ProgressReporter reporter(context);
  std::optional<LossScaler> scaler;
  if (scales_loss(config, backend)) scaler.emplace(registry);
  auto& allreduce = reporter.mean_ms("allreduce_ms", "pstrain_worker_allreduce_seconds",
                                     "Time per step in all-reduce calls.");
  auto& wait = reporter.mean_ms("wait_ms", "pstrain_worker_wait_seconds",
                                "Time per step waiting for the last buckets' all-reduce.");
  auto& optimizer =
      reporter.mean_ms("optimizer_ms", "pstrain_worker_optimizer_seconds",
                       "Time per step averaging the gradients and applying the optimizer.");
  auto& overlap = reporter.mean("overlap", "pstrain_worker_allreduce_overlap_ratio",
                                "Fraction of the all-reduce hidden behind backward.",
                                {0, 0.25, 0.5, 0.75, 0.9, 1});
  // Only the mean matters (sum and count): no buckets.
  auto& scale = reporter.mean("lr_scale", "pstrain_worker_lr_scale",
                              "Learning-rate factor of linear scaling and warm-up.", {});
  auto& restarts = reporter.total("sync_restarts", "pstrain_worker_sync_restarts_total",
                                  "Sync attempts this worker abandoned because a peer failed.");

  // Trains the steps after attempt.step from the ps's weights; throws
  // CommError when a peer fails. The replica (optimizer state, so it starts
  // afresh on every worker alike, buckets, communication thread) lives for
  // one attempt.
  std::uint64_t done = 0;  // the last step this process completed
  const auto train_attempt = [&](const SyncAttempt& attempt, Communicator& comm) {
    read_from_ps();
    shard.seek(attempt.step * accumulate_steps, config.train.batch_size);
    const std::uint32_t local_steps =
        traits(config.mode).worker == WorkerStrategy::local_sgd ? config.train.local_steps : 0;
    SyncReplica replica(
        backend, model, comm, config.optimizer, config.train.bucket_bytes, true, local_steps,
        accumulate_steps,
        records_steps(config, backend) ? static_cast<int>(config.train.batch_size) : 0);
    if (scaler) replica.scale_loss(&*scaler);
    BatchFeeder feeder(backend, model, shard, config.train.batch_size);
    if (local_steps > 0)
      log("local SGD: weights averaged every ", local_steps, " steps by ", comm.name(),
          " all-reduce over ", comm.size(), " workers, ", steps, " steps; attempt ", attempt.number,
          " starts at step ", attempt.step + 1);
    else
      log("sync mode: ", comm.name(), " all-reduce over ", comm.size(), " workers, ",
          replica.buckets(), " buckets, ", steps, " steps; attempt ", attempt.number,
          " starts at step ", attempt.step + 1);
    for (std::uint64_t step = attempt.step + 1; step <= steps; ++step) {
      // The micro-batches before the last only add to this worker's
      // gradient (their losses readable once their work is done).
      std::size_t samples = 0;
      double loss_sum = 0;
      double accumulate_ms = 0;
      for (std::uint32_t m = micro_batches(config, shard, step - 1); m > 1; --m) {
        const auto t = Clock::now();
        const Batch b = feeder.load();
        replica.accumulate(static_cast<int>(b.size));
        feeder.fetch_losses();
        feeder.stage_next();
        backend.synchronize();
        accumulate_ms += ms_between(t, Clock::now());
        samples += b.size;
        loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
      }
      const Batch b = feeder.load();
      const float lr_scale = sync_lr_scale(config.train, comm.size(), step);
      SyncStepTimes t = replica.step(static_cast<int>(b.size), lr_scale);
      // Local SGD ends on an average, whatever H: every replica the same.
      if (local_steps > 0 && step == steps && step % local_steps != 0) replica.average_weights();
      feeder.fetch_losses();
      feeder.stage_next();
      if (!direct) backend.synchronize();
      // Collectives that run on the device were timed there: the host saw
      // only their enqueue.
      if (const auto device = comm.device_times()) {
        t.allreduce_ms = device->busy_ms;
        t.wait_ms = device->after_mark_ms;
      }
      done = step;
      if (index == 0 && (step % config.train.sync_every == 0 || step == steps)) write_to_ps(step);

      // The registry keeps seconds.
      samples += b.size;
      loss_sum += feeder.mean_loss() * static_cast<double>(b.size);
      reporter.step(samples, loss_sum / static_cast<double>(samples),
                    (accumulate_ms + t.compute_ms) / 1e3);
      allreduce.observe(t.allreduce_ms / 1e3);
      wait.observe(t.wait_ms / 1e3);
      optimizer.observe(t.optimizer_ms / 1e3);
      overlap.observe(t.allreduce_ms > 0 ? 1 - t.wait_ms / t.allreduce_ms : 0);
      scale.observe(lr_scale);
      reporter.end_step(step == steps);
    }
  };

  std::uint64_t failed = 0;  // the attempt a peer's failure ended
  while (true) {
    const SyncAttempt attempt = join_sync_run(ps, config, index, failed);
    if (failed > 0) {
      restarts.add();
      log("sync restart: attempt ", attempt.number, " resumes after step ", attempt.step,
          " (the weights on the ps); this worker lost ",
          done > attempt.step ? done - attempt.step : 0, " steps (it had completed step ", done,
          ")");
    } else if (attempt.step > 0) {
      log("sync restart: the run is under way; joining attempt ", attempt.number, " after step ",
          attempt.step, " (the weights on the ps)");
    }
    // A failure to connect ends the worker rather than the attempt: it
    // may be this worker's own (workers[i].host), which no retry mends.
    // The communicator is destroyed at the end of the iteration, closing
    // this worker's sockets, so peers still in a failed step fail at once.
    const auto comm = make_communicator(config, index, backend, ps, attempt.prefix);
    try {
      train_attempt(attempt, *comm);
      return reporter.finish();
    } catch (const CommError& e) {
      // NCCL communicators cannot be rebuilt after a failure yet
      // (docs/sync.md, "Restarts").
      if (!backend.host_accessible()) throw;
      log("sync attempt ", attempt.number, " failed after step ", done, ": ", e.what(),
          "; abandoning the step and re-joining");
      failed = attempt.number;
    }
  }
}

}  // namespace pstrain
