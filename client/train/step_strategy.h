#pragma once
// How a mode turns a step's gradients into the next step's weights: the
// part of training that differs between modes (shared/modes.h,
// WorkerStrategy). The training loop (client/train/trainer.h) calls, per
// optimizer step:
//
//   begin(step)        before the step's first micro-batch
//   accumulate(n) ...  each micro-batch before the last (accumulation)
//   issue(step, n)     the last micro-batch: forward, backward, gradients out
//   finish(step, last) the gradients' answer waited for and applied
//
// and start() before the first step of a run or attempt, end() after the
// last, recover() when a peer fails during a step. Implementations:
// PsStep (async, ssp, backup: client/train/ps_step.h) and ReplicaStep (sync
// and local SGD: client/train/replica_step.h). A new mode is one more.
#include <cstdint>
#include <memory>

#include "client/comm/communicator.h"
#include "client/train/step_metrics.h"
#include "client/train/train_context.h"

namespace pstrain {

class StepStrategy {
 public:
  virtual ~StepStrategy() = default;

  // Brings the model's weights to where training (re)starts and returns the
  // optimizer steps done before it: `resume_step` (where ps 0's count puts a
  // restarted worker) through the ps, the step an attempt resumes after for
  // the all-reduce modes.
  virtual std::uint64_t start(std::uint64_t resume_step) = 0;
  // Before optimizer step `step`'s (0-based) first micro-batch.
  virtual void begin(std::uint64_t step) = 0;
  // A micro-batch before the step's last: forward and backward on the first
  // n samples of the model's input; its gradients join the step's.
  virtual void accumulate(int n) = 0;
  // The step's last micro-batch: forward and backward on its n samples, and
  // the step's gradients sent (pushed, all-reduced) as they are known.
  virtual void issue(std::uint64_t step, int n) = 0;
  // Waits for what issue() sent and completes the step: on return the model
  // holds the weights the next step computes on, and the backend work issued
  // before the call (the batch's losses) has completed. `last`: the run's.
  virtual void finish(std::uint64_t step, bool last) = 0;
  // A peer failed during a step (CommError from any call above). True: the
  // strategy can go on, and the loop calls start() again; false: the error
  // ends the worker.
  virtual bool recover(const CommError& error) = 0;
  // After the run's last step.
  virtual void end() = 0;
};

// The strategy of `context.config.mode` (traits(mode).worker); its figures
// go into `metrics`, which must outlive it.
std::unique_ptr<StepStrategy> make_step_strategy(const TrainContext& context, StepMetrics& metrics);

}  // namespace pstrain
