#pragma once
// Synchronous data-parallel steps (mode: sync): every worker computes
// gradients on its own batch, the workers sum them with an all-reduce
// (GradReducer, in buckets that overlap backward), and each applies the same
// averaged gradient with the same optimizer to its own replica of the
// weights, so the replicas stay bit-identical without ever exchanging
// weights (CPU workers of one build, whatever their SIMD level; not CPU
// against GPU: docs/sync.md, "Bit-identical replicas").
//
// NCCL's collectives are timed on the device (Communicator::device_times),
// so allreduce_ms, wait_ms and overlap are what the GPU did, not how long
// the host took to enqueue. Where steps are recorded (train.cuda_graphs,
// records_steps), forward and backward replay one CUDA graph and the
// averaging and optimizer step another; the all-reduces then start after
// the whole backward, between the two.
//
// fp16 checks for overflow on the all-reduced sums, so every replica skips
// a step alike.
#include <cstddef>
#include <cstdint>
#include <string>

#include "client/comm/communicator.h"
#include "client/compute/backend.h"
#include "client/train/grad_accumulator.h"
#include "client/train/grad_reducer.h"
#include "client/train/replica.h"
#include "client/train/replica_optimizer.h"

namespace pstrain {

class Model;

class SyncReplica final : public Replica {
 public:
  // The model's weights must be the same on every worker. `overlap`: see
  // GradReducer. `accumulate_steps` > 1: room for accumulate()'s sum.
  // `record_batch` > 0: steps on batches of that size are recorded
  // (StepGraphs; only where records_steps allows it).
  SyncReplica(Backend& backend, Model& model, Communicator& comm, const OptimizerConfig& optimizer,
              std::size_t bucket_bytes, bool overlap, std::uint32_t accumulate_steps = 1,
              int record_batch = 0);

  void accumulate(int n) override;
  double issue(int n) override;
  SyncStepTimes finish(float lr_scale, bool last) override;
  std::string describe() const override;
  std::size_t buckets() const { return reducer_.buckets(); }

 private:
  Backend& backend_;
  Model& model_;
  Communicator& comm_;
  GradReducer reducer_;
  GradAccumulator accumulator_;  // and forward and backward's step graph
  ReplicaOptimizer optimizer_;
  std::uint64_t steps_ = 0;  // applied
};

}  // namespace pstrain
