#pragma once
// A replica's optimizer (sync, local SGD): the optimizer state beside the
// weights in backend memory, applied to every variable in one
// Backend::apply_optimizers call, from a step graph where steps are
// recorded (train.cuda_graphs).
#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "client/compute/backend.h"
#include "client/train/step_graphs.h"
#include "shared/config.h"

namespace pstrain {

class Model;

class ReplicaOptimizer {
 public:
  // `grads[i]`: where variable i's gradient is when step() runs (the
  // model's, or its place in an all-reduce bucket). `prepare`: work that
  // precedes the optimizer in every step (sync's averaging of the summed
  // gradients), recorded with it. `record`: run from a step graph.
  // The state starts as the optimizer says (zeros, or Adagrad's
  // accumulator), the same on every replica.
  ReplicaOptimizer(Backend& backend, Model& model, const OptimizerConfig& optimizer,
                   const std::vector<float*>& grads, bool record,
                   std::function<void()> prepare = {});
  ReplicaOptimizer(const ReplicaOptimizer&) = delete;  // its graph calls back into it
  ReplicaOptimizer& operator=(const ReplicaOptimizer&) = delete;

  // prepare(), then the optimizer step `scalars.step` (1-based) with the
  // learning rate scaled by `scalars.lr_scale`.
  void step(const StepScalars& scalars);

 private:
  void apply(const StepScalars& scalars);

  Backend& backend_;
  OptimizerConfig optimizer_;
  std::function<void()> prepare_;
  DeviceMemory state_;
  // Every variable's weights, gradient and state, for apply_optimizers.
  std::vector<OptimizerTensor> tensors_;
  // The step's graph where steps are recorded (its shape never changes: its
  // "batch" is 0).
  std::optional<StepGraphs> graphs_;
};

}  // namespace pstrain
