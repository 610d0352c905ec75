#pragma once
// Running a step's work from a recorded step graph (CUDA graphs,
// train.cuda_graphs): eager first, then recorded once, then replayed.
#include <functional>
#include <memory>
#include <string>

#include "client/compute/backend.h"

namespace pstrain {

// A trainer's step work (forward and backward, or the optimizer step) for
// batches of `batch_size`, from a step graph. The first full batch runs
// eagerly, so that lazy set-up (cuBLASLt's and cuDNN's plans, the loading of
// kernels) happens outside a capture; the second records the graph and the
// later ones replay it. A smaller batch (an epoch's last) runs eagerly: it
// comes once an epoch, where a graph of its own would cost a capture for one
// replay. When recording fails (a driver that refuses the capture), the
// worker's log says why once and every step runs eagerly from then on.
class StepGraphs {
 public:
  using Work = std::function<void(int n, const StepScalars& scalars)>;
  enum class Ran { eager, recorded, replayed };

  // `what` names the work in the log ("forward and backward").
  StepGraphs(Backend& backend, int batch_size, std::string what, Work work);
  StepGraphs(const StepGraphs&) = delete;  // its graph calls back into it
  StepGraphs& operator=(const StepGraphs&) = delete;
  Ran run(int n, const StepScalars& scalars);

 private:
  Backend& backend_;
  int batch_size_;
  std::string what_;
  Work work_;
  bool warmed_up_ = false;
  bool failed_ = false;
  std::unique_ptr<StepGraph> graph_;
};

}  // namespace pstrain
