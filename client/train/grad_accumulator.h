#pragma once
// A step's gradient over several micro-batches (train.accumulate_steps),
// and the forward and backward of a step's last micro-batch.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "client/compute/backend.h"
#include "client/train/step_graphs.h"

namespace pstrain {

class Model;

// Gradient accumulation (train.accumulate_steps): a step's gradient is the
// mean of its micro-batches' gradients weighted by their sizes, which is the
// gradient of one batch of their union (the loss is a mean over the batch).
// The running sum lives in backend memory beside the model's gradients, one
// buffer per variable, allocated only when steps > 1. A loss scale
// (Model::set_loss_scale) is divided out of the step's gradient.
//
// Where steps are recorded (`record_batch` > 0, as records_steps allows:
// one micro-batch per step), finish() replays a batch of record_batch's
// forward and backward from a step graph (StepGraphs) and then issues every
// gradient, last layer first: they are known only once the whole graph is.
class GradAccumulator {
 public:
  GradAccumulator(Backend& backend, Model& model, std::uint32_t steps, int record_batch = 0);

  // Forward and backward on the first n samples of the model's input, a
  // micro-batch before the step's last: its gradients join the sum.
  void add(int n);
  // The step's last micro-batch: forward and backward, and on_grad_issued(i)
  // (as Model::forward_backward calls it) once model.grad(i) holds the
  // step's gradient. Starts the next step's sum afresh.
  // The loss scale must not change between a step's add()s and finish().
  void finish(int n, const std::function<void(std::size_t variable)>& on_grad_issued);

 private:
  Backend& backend_;
  Model& model_;
  std::vector<DeviceMemory> sums_;
  double samples_ = 0;  // in sums_
  std::optional<StepGraphs> graphs_;
};

}  // namespace pstrain
