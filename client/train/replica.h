#pragma once
// A worker's replica of the model in the all-reduce modes (sync, local SGD):
// the weights and optimizer state every worker keeps alike in its own
// backend memory, and how it takes a step with its peers. ReplicaStep
// (client/train/replica_step.h) runs one per attempt.
#include <string>

#include "client/train/loss_scaler.h"

namespace pstrain {

struct SyncStepTimes {
  double compute_ms = 0;    // forward and backward (issuing them, on a GPU)
  double allreduce_ms = 0;  // the all-reduce calls, summed (host time)
  double wait_ms = 0;       // after backward, until every all-reduce was done (host time)
  double optimizer_ms = 0;  // averaging and the optimizer
};

class Replica {
 public:
  virtual ~Replica() = default;

  // Gradient accumulation: forward and backward on the first n samples of
  // the model's input, a micro-batch before a step's last; its gradients
  // join the step's (on this worker only: nothing is exchanged).
  virtual void accumulate(int n) = 0;
  // The step's last micro-batch: forward and backward on its first n
  // samples (with the micro-batches accumulated since the last step: their
  // size-weighted mean gradient), starting what the mode exchanges as
  // backward produces it. Returns compute_ms.
  virtual double issue(int n) = 0;
  // Completes the step issue() began: waits for the exchange and applies the
  // optimizer with the learning rate scaled by `lr_scale`. `last`: the run's
  // last step, on which every replica ends alike. Throws CommError when a
  // peer fails.
  virtual SyncStepTimes finish(float lr_scale, bool last) = 0;
  // issue(n), then finish(lr_scale, false).
  SyncStepTimes step(int n, float lr_scale) {
    const double compute_ms = issue(n);
    SyncStepTimes times = finish(lr_scale, false);
    times.compute_ms = compute_ms;
    return times;
  }
  // fp16 (train.precision): steps scale the loss by scaler's scale and skip
  // the optimizer when a gradient overflowed. Null: no scaling. The scaler
  // must outlive the replica.
  void scale_loss(LossScaler* scaler) { scaler_ = scaler; }
  // "sync mode: Gloo all-reduce over 2 workers, 3 buckets", for the log.
  virtual std::string describe() const = 0;

 protected:
  LossScaler* scaler_ = nullptr;
};

}  // namespace pstrain
