#pragma once
// Synchronous data-parallel training: every worker computes gradients on its
// own batch, the workers sum them with an all-reduce (Communicator), and each
// applies the same averaged gradient with the same optimizer to its own
// replica of the weights, so the replicas stay bit-identical without ever
// exchanging weights (CPU workers of one build, whatever their SIMD level;
// not CPU against GPU: docs/sync.md, "Bit-identical replicas"). The parameter servers only hold a
// copy for evaluation, snapshots, the saved model and restarts: worker 0 writes it every
// train.sync_every steps and at the end.
//
// Local SGD (mode: local) is the same replica with local_steps H: each
// worker applies its own gradient with its own optimizer state, and every H
// steps the workers average their weights with one all-reduce per variable,
// H times fewer exchanges than sync. With H = 1 and SGD or momentum (linear
// in the gradient) the average equals sync's step, to float rounding.
//
// Gradients are fused into buckets of about train.bucket_bytes, filled from
// the last layer down as backward produces them: each bucket is a backend
// allocation of its own, its variables' gradients side by side, copied in
// (Backend::axpby, exact) as they are issued and averaged and read by the
// optimizer in place. With Gloo, a communication thread all-reduces each
// bucket as soon as it is full, while backward still runs on the layers
// below; with NCCL a full bucket's all-reduce is queued at once on NCCL's
// own stream, while backward goes on with the layers below on the compute
// stream. One allocation per bucket, not one flat buffer, because the CUDA
// backend orders work per allocation: the next bucket's copies would
// otherwise wait for this bucket's all-reduce. NCCL's collectives are timed
// on the device (Communicator::device_times), so allreduce_ms, wait_ms and
// overlap are what the GPU did, not how long the host took to enqueue.
//
// Where steps are recorded (train.cuda_graphs, records_steps), forward and
// backward replay one CUDA graph and the averaging and optimizer step
// another; the all-reduces then start after the whole backward, between
// the two.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "client/comm/communicator.h"
#include "client/compute/backend.h"
#include "client/train/loss_scaler.h"
#include "client/train/train_loop.h"
#include "shared/config.h"
#include "shared/shard_map.h"

namespace pstrain {

class Model;
class PsClient;

// The learning-rate factor of 1-based step `step`: `workers` with
// train.lr_scaling (the linear scaling rule), else 1; during the first
// train.warmup_steps steps it rises linearly to that value, from 1 with
// scaling (Goyal et al.) and from 0 without.
float sync_lr_scale(const TrainConfig& train, int workers, std::uint64_t step);

// One gradient bucket: variables [first_variable, last_variable], `count`
// floats in all.
struct GradientBucket {
  std::size_t first_variable = 0;
  std::size_t last_variable = 0;
  std::size_t count = 0;
};
// The buckets of `vars` in the order backward fills them, from the last
// variable down: a bucket takes variables until it holds at least
// `bucket_bytes` (so a variable larger than that is a bucket of its own).
std::vector<GradientBucket> gradient_buckets(const std::vector<VariableSpec>& vars,
                                             std::size_t bucket_bytes);

struct SyncStepTimes {
  double compute_ms = 0;    // forward and backward (issuing them, on a GPU)
  double allreduce_ms = 0;  // the buckets' all-reduce calls, summed (host time)
  double wait_ms = 0;       // after backward, until every bucket was reduced (host time)
  double optimizer_ms = 0;  // averaging and the optimizer
};

// One worker's replica: its model's weights, the optimizer state beside them
// in backend memory, and the gradient buckets. The model's weights must be
// the same on every worker before the first step.
class SyncReplica {
 public:
  // `overlap`: all-reduce buckets on a communication thread during backward
  // (host-accessible backends); otherwise after backward, on the caller's
  // thread.
  // `local_steps`: 0 for sync; H > 0 for local SGD (no gradient all-reduce,
  // weights averaged every H steps). `accumulate_steps` > 1: room for the
  // gradient sum of accumulate() (train.accumulate_steps).
  // `record_batch` > 0: steps on batches of that size are recorded
  // (StepGraphs; only where records_steps allows it).
  SyncReplica(Backend& backend, Model& model, Communicator& comm, const OptimizerConfig& optimizer,
              std::size_t bucket_bytes, bool overlap, std::uint32_t local_steps = 0,
              std::uint32_t accumulate_steps = 1, int record_batch = 0);
  SyncReplica(const SyncReplica&) = delete;
  SyncReplica& operator=(const SyncReplica&) = delete;

  // Gradient accumulation: forward_backward on the first n samples of the
  // model's input, a micro-batch before a step's last; its gradients join
  // the step's (on this worker only: nothing is exchanged).
  void accumulate(int n);
  // forward_backward on the first n samples of the model's input (with the
  // micro-batches accumulated since the last step: their size-weighted mean
  // gradient), all-reduce, average, and the optimizer step. Throws CommError
  // when a peer fails.
  // Local SGD: the step averages the weights every local_steps steps
  // (allreduce_ms times it).
  SyncStepTimes step(int n, float lr_scale);
  std::size_t buckets() const { return buckets_.size(); }
  // fp16 (train.precision): steps scale the loss by scaler's scale and skip
  // the optimizer when a gradient overflowed. In sync mode the check is on
  // the all-reduced sums, so every replica skips alike; in local SGD each
  // checks its own. Null: no scaling. The scaler must outlive the replica.
  void scale_loss(LossScaler* scaler) { scaler_ = scaler; }
  // Local SGD: averages the weights over the workers now (every worker must
  // call it at the same step: a run's last, so all end alike).
  void average_weights();

 private:
  struct Bucket {
    Bucket(GradientBucket p, DeviceMemory m) : plan(p), memory(std::move(m)) {}
    float* data() const { return memory.data(); }
    GradientBucket plan;
    DeviceMemory memory;  // the gradients of plan's variables, in order
  };
  void reduce(std::size_t bucket);
  void communicate(std::stop_token stop);
  void enqueue(std::size_t bucket);
  void wait_reduced();
  SyncStepTimes local_step(int n, float lr_scale);
  // Sync: averages the reduced gradients; both: the optimizer step. From
  // optimizer_graphs_ where steps are recorded, else by apply_optimizer.
  void optimize(const StepScalars& scalars);
  void apply_optimizer(const StepScalars& scalars);

  Backend& backend_;
  Model& model_;
  Communicator& comm_;
  OptimizerConfig optimizer_;
  std::size_t slots_;
  bool enqueued_;  // collectives are queued behind device work (NCCL), not done on return
  bool overlap_;
  std::uint32_t local_steps_;
  std::vector<std::size_t> offset_;  // of each variable's state in state_, / slots
  std::vector<std::size_t> bucket_of_;
  std::vector<Bucket> buckets_;    // none in local SGD
  std::vector<float*> in_bucket_;  // each variable's gradient in its bucket
  // Every variable's weights, gradient (in its bucket; the model's in local
  // SGD) and state, for one apply_optimizers call.
  std::vector<OptimizerTensor> tensors_;
  DeviceMemory state_;
  GradAccumulator accumulator_;  // and forward and backward's step graph
  // optimize()'s step graph where steps are recorded (its shape never
  // changes: its "batch" is 0).
  std::optional<StepGraphs> optimizer_graphs_;
  LossScaler* scaler_ = nullptr;
  std::uint64_t steps_ = 0;

  // The communication thread's queue; it alone calls comm_ during a step.
  std::mutex mutex_;
  std::condition_variable_any cv_;
  std::deque<std::size_t> queue_;
  std::size_t reduced_ = 0;
  double allreduce_ms_ = 0;
  std::exception_ptr error_;
  std::jthread thread_;
};

// Joins the run (client/comm/rendezvous.h), pulls the weights, trains
// train.epochs, and (worker 0) leaves the final weights on the ps, recording
// the step of every write there. When a peer fails during a step (CommError),
// the worker abandons the step and joins the next attempt, which resumes at
// the step of the weights on the ps with the optimizer state reset on every
// replica (docs/sync.md, "Restarts"). Throws CommError when a rendezvous
// does not complete within net.worker_timeout, or when a peer fails on a
// backend whose communicator (NCCL) cannot be rebuilt.
TrainSummary train_sync(const TrainContext& context);

}  // namespace pstrain
