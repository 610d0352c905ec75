#include "client/train/replica_step.h"

#include "client/comm/communicator_factory.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/backend_setup.h"
#include "client/train/local_sgd_replica.h"
#include "client/train/step_budget.h"
#include "client/train/sync_replica.h"
#include "shared/log.h"
#include "shared/modes.h"

namespace pstrain {

float sync_lr_scale(const TrainConfig& train, int workers, std::uint64_t step) {
  // The rule scales with the effective batch: workers x accumulated micro-batches.
  const double target =
      train.lr_scaling ? static_cast<double>(workers) * train.accumulate_steps : 1.0;
  if (step >= train.warmup_steps) return static_cast<float>(target);
  const double start = train.lr_scaling ? 1.0 : 0.0;
  return static_cast<float>(start + (target - start) * static_cast<double>(step) /
                                        static_cast<double>(train.warmup_steps));
}

ReplicaStep::ReplicaStep(const TrainContext& context, StepMetrics& metrics)
    : context_(context),
      host_(context.backend, context.model, false),
      requests_(context.ps),
      allreduce_(metrics.mean_ms("allreduce_ms", "pstrain_worker_allreduce_seconds",
                                 "Time per step in all-reduce calls.")),
      wait_(metrics.mean_ms("wait_ms", "pstrain_worker_wait_seconds",
                            "Time per step waiting for the last buckets' all-reduce.")),
      optimizer_(
          metrics.mean_ms("optimizer_ms", "pstrain_worker_optimizer_seconds",
                          "Time per step averaging the gradients and applying the optimizer.")),
      overlap_(metrics.mean("overlap", "pstrain_worker_allreduce_overlap_ratio",
                            "Fraction of the all-reduce hidden behind backward.",
                            {0, 0.25, 0.5, 0.75, 0.9, 1})),
      // Only the mean matters (sum and count): no buckets.
      lr_scale_(metrics.mean("lr_scale", "pstrain_worker_lr_scale",
                             "Learning-rate factor of linear scaling and warm-up.", {})),
      restarts_(metrics.total("sync_restarts", "pstrain_worker_sync_restarts_total",
                              "Sync attempts this worker abandoned because a peer failed.")) {
  if (scales_loss(context.config, context.backend)) scaler_.emplace(context.registry);
}

void ReplicaStep::read_from_ps() {
  // Every replica of an attempt starts from the ps's weights, so they agree
  // from its first step.
  auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context_;
  const auto& vars = model.variables();
  for (std::size_t i = 0; i < vars.size(); ++i) ps.pull(vars[i].name, host_.weights(i));
  ps.wait_all();
  if (host_.direct()) return;
  for (std::size_t i = 0; i < vars.size(); ++i)
    backend.upload(host_.weights(i).data(), model.param(i).data(), host_.weights(i).size_bytes());
  backend.synchronize();
}

void ReplicaStep::write_to_ps(std::uint64_t step) {
  auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context_;
  const auto& vars = model.variables();
  if (!host_.direct()) {
    for (std::size_t i = 0; i < vars.size(); ++i)
      backend.download(model.param(i).data(), host_.weights(i).data(),
                       host_.weights(i).size_bytes());
    backend.synchronize();
  }
  for (std::size_t i = 0; i < vars.size(); ++i) ps.assign(vars[i].name, host_.weights(i));
  ps.wait_all();
  // Only once every chunk is there: a restart resumes from these weights.
  record_sync_step(ps, config, step);
}

std::unique_ptr<Replica> ReplicaStep::make_replica(Communicator& comm) const {
  const auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context_;
  const int record = recorded_batch(config, backend);
  if (traits(config.mode).worker == WorkerStrategy::local_sgd)
    return std::make_unique<LocalSgdReplica>(backend, model, comm, config.optimizer,
                                             config.train.local_steps,
                                             config.train.accumulate_steps, record);
  return std::make_unique<SyncReplica>(backend, model, comm, config.optimizer,
                                       config.train.bucket_bytes, true,
                                       config.train.accumulate_steps, record);
}

std::uint64_t ReplicaStep::start(std::uint64_t) {
  auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context_;
  attempt_ = join_sync_run(ps, config, index, failed_);
  const SyncAttempt& attempt = *attempt_;
  if (failed_ > 0) {
    restarts_.add();
    log("sync restart: attempt ", attempt.number, " resumes after step ", attempt.step,
        " (the weights on the ps); this worker lost ",
        done_ > attempt.step ? done_ - attempt.step : 0, " steps (it had completed step ", done_,
        ")");
  } else if (attempt.step > 0) {
    log("sync restart: the run is under way; joining attempt ", attempt.number, " after step ",
        attempt.step, " (the weights on the ps)");
  }
  replica_.reset();  // until the attempt's steps begin: recover() refuses
  comm_ = make_communicator(config, index, backend, ps, attempt.prefix);
  read_from_ps();
  replica_ = make_replica(*comm_);
  if (scaler_) replica_->scale_loss(&*scaler_);
  log(replica_->describe(), ", ", optimizer_steps(config, shard), " steps; attempt ",
      attempt.number, " starts at step ", attempt.step + 1);
  return attempt.step;
}

void ReplicaStep::finish(std::uint64_t step, bool last) {
  auto& [config, index, backend, model, ps, shard, metrics, registry, hook] = context_;
  const float lr_scale = sync_lr_scale(config.train, comm_->size(), step + 1);
  SyncStepTimes t = replica_->finish(lr_scale, last);
  if (!backend.host_accessible()) backend.synchronize();
  // Collectives that run on the device were timed there: the host saw only
  // their enqueue.
  if (const auto device = comm_->device_times()) {
    t.allreduce_ms = device->busy_ms;
    t.wait_ms = device->after_mark_ms;
  }
  done_ = step + 1;
  if (index == 0 && (done_ % config.train.sync_every == 0 || last)) write_to_ps(done_);
  // The registry keeps seconds.
  allreduce_.observe(t.allreduce_ms / 1e3);
  wait_.observe(t.wait_ms / 1e3);
  optimizer_.observe(t.optimizer_ms / 1e3);
  overlap_.observe(t.allreduce_ms > 0 ? 1 - t.wait_ms / t.allreduce_ms : 0);
  lr_scale_.observe(lr_scale);
}

bool ReplicaStep::recover(const CommError& error) {
  // NCCL communicators cannot be rebuilt after a failure yet (docs/sync.md,
  // "Restarts").
  if (!context_.backend.host_accessible() || !replica_) return false;
  log("sync attempt ", attempt_->number, " failed after step ", done_, ": ", error.what(),
      "; abandoning the step and re-joining");
  failed_ = attempt_->number;
  // Closing this worker's sockets now, so that peers still in the failed
  // step fail at once rather than at their deadline.
  replica_.reset();
  comm_.reset();
  return true;
}

}  // namespace pstrain
