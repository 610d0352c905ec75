#pragma once
// Steps of the all-reduce modes (sync, local SGD): each worker keeps a
// replica of the model (client/train/replica.h: SyncReplica, LocalSgdReplica)
// and the parameter servers only hold a copy for evaluation, snapshots, the
// saved model and restarts: worker 0 writes it every train.sync_every steps
// and at the end.
//
// A run goes in attempts (client/comm/rendezvous.h): each joins the workers,
// builds a communicator and a fresh replica (optimizer state, buckets,
// communication thread) and starts from the weights on the ps. When a peer
// fails during a step (CommError), the worker abandons the step and joins
// the next attempt, which resumes at the step of the weights on the ps with
// the optimizer state reset on every replica alike (docs/sync.md,
// "Restarts"). A rendezvous that does not complete within
// net.worker_timeout, or a failure on a backend whose communicator (NCCL)
// cannot be rebuilt, ends the worker.
#include <cstdint>
#include <memory>
#include <optional>

#include "client/comm/communicator.h"
#include "client/comm/rendezvous.h"
#include "client/train/host_views.h"
#include "client/train/loss_scaler.h"
#include "client/train/replica.h"
#include "client/train/step_strategy.h"

namespace pstrain {

// The learning-rate factor of 1-based step `step`: `workers` x
// train.accumulate_steps with train.lr_scaling (the linear scaling rule),
// else 1; during the first train.warmup_steps steps it rises linearly to
// that value, from 1 with scaling (Goyal et al.) and from 0 without.
float sync_lr_scale(const TrainConfig& train, int workers, std::uint64_t step);

class ReplicaStep final : public StepStrategy {
 public:
  ReplicaStep(const TrainContext& context, StepMetrics& metrics);

  // Joins the next attempt, reads the ps's weights and returns their step.
  std::uint64_t start(std::uint64_t resume_step) override;
  void begin(std::uint64_t) override {}
  void accumulate(int n) override { replica_->accumulate(n); }
  void issue(std::uint64_t, int n) override { replica_->issue(n); }
  // The replica's step, and worker 0's copy on the ps when due.
  void finish(std::uint64_t step, bool last) override;
  // Ends the attempt: true during an attempt's steps on backends whose
  // communicator can be rebuilt; false for a failure to join or connect,
  // which may be this worker's own (workers[i].host) and no retry mends.
  bool recover(const CommError& error) override;
  void end() override {}

 private:
  void read_from_ps();
  void write_to_ps(std::uint64_t step);
  std::unique_ptr<Replica> make_replica(Communicator& comm) const;

  const TrainContext& context_;
  const HostViews host_;  // of the weights, for pulling and assigning
  // After host_: abandons requests that would outlive its buffers.
  const PsRequestsGuard requests_;
  std::optional<LossScaler> scaler_;  // across attempts
  std::optional<SyncAttempt> attempt_;
  std::uint64_t failed_ = 0;  // the attempt a peer's failure ended
  std::uint64_t done_ = 0;    // the last step this process completed
  // The attempt's, null outside one: the replica goes before the communicator it uses, whose
  // destruction closes this worker's sockets so that peers still in a
  // failed step fail at once.
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Replica> replica_;
  Histogram& allreduce_;
  Histogram& wait_;
  Histogram& optimizer_;
  Histogram& overlap_;
  Histogram& lr_scale_;
  Counter& restarts_;
};

}  // namespace pstrain
