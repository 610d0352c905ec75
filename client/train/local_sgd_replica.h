#pragma once
// Local SGD (mode: local): each worker applies its own gradient with its
// own optimizer state, and every H (train.local_steps) steps the workers
// average their weights with one all-reduce per variable, H times fewer
// exchanges than sync. With H = 1 and SGD or momentum (linear in the
// gradient) the average equals sync's step, to float rounding. fp16 checks
// each replica's own gradients; a skipped step still counts towards the
// average, which every replica must reach at the same step.
#include <cstdint>
#include <string>

#include "client/comm/communicator.h"
#include "client/compute/backend.h"
#include "client/train/grad_accumulator.h"
#include "client/train/replica.h"
#include "client/train/replica_optimizer.h"

namespace pstrain {

class Model;

class LocalSgdReplica final : public Replica {
 public:
  // The model's weights must be the same on every worker. `local_steps`: H
  // > 0. `accumulate_steps`, `record_batch`: as SyncReplica's.
  LocalSgdReplica(Backend& backend, Model& model, Communicator& comm,
                  const OptimizerConfig& optimizer, std::uint32_t local_steps,
                  std::uint32_t accumulate_steps = 1, int record_batch = 0);

  void accumulate(int n) override;
  double issue(int n) override;
  // Averages every H steps and on the run's last step, whatever H: every
  // replica ends the same.
  SyncStepTimes finish(float lr_scale, bool last) override;
  std::string describe() const override;

 private:
  // Averages the weights over the workers now (every worker at the same
  // step).
  void average_weights();

  Backend& backend_;
  Model& model_;
  Communicator& comm_;
  std::uint32_t local_steps_;
  GradAccumulator accumulator_;  // and forward and backward's step graph
  ReplicaOptimizer optimizer_;
  std::uint64_t steps_ = 0;  // taken, applied or skipped
};

}  // namespace pstrain
