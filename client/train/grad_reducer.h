#pragma once
// Sums the workers' gradients with all-reduce (sync mode), in buckets that
// overlap backward.
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
// otherwise wait for this bucket's all-reduce.
//
// Thread rules: add(), finish(), average() and all_finite() are the
// owner's; the communication thread alone calls the communicator between a
// step's first add() and finish()'s return.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "client/comm/communicator.h"
#include "client/compute/backend.h"
#include "shared/shard_map.h"

namespace pstrain {

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

class GradReducer {
 public:
  // `overlap`: all-reduce buckets on a communication thread during backward
  // (host-accessible backends); otherwise after backward, on the caller's
  // thread. Backends the host cannot reach queue each bucket's collective as
  // it fills, whatever `overlap`.
  GradReducer(Backend& backend, const std::vector<VariableSpec>& vars, Communicator& comm,
              std::size_t bucket_bytes, bool overlap);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  std::size_t buckets() const { return buckets_.size(); }
  // Where variable i's gradient is summed: its place in its bucket.
  float* gradient(std::size_t variable) const { return in_bucket_[variable]; }

  // A step starts: no bucket reduced yet.
  void begin();
  // Variable i's gradient for the step is `grad`: copied into its bucket
  // (behind the work that wrote it); a bucket whose last variable this is
  // starts its all-reduce.
  void add(std::size_t variable, const float* grad);
  // After backward: reduces the buckets add() did not and waits until every
  // bucket is summed. Returns the all-reduce calls' time (ms, host). Throws
  // CommError when a peer fails.
  double finish();
  // Divides every bucket by the number of workers: the mean gradient.
  void average();
  // Whether every summed gradient is finite (fp16's overflow check).
  bool all_finite() const;

 private:
  struct Bucket {
    Bucket(GradientBucket p, DeviceMemory m) : plan(p), memory(std::move(m)) {}
    float* data() const { return memory.data(); }
    GradientBucket plan;
    DeviceMemory memory;  // the gradients of plan's variables, in order
  };
  void reduce(std::size_t bucket);
  void communicate(std::stop_token stop);

  Backend& backend_;
  Communicator& comm_;
  std::vector<std::size_t> sizes_;  // of each variable
  bool enqueued_;  // collectives are queued behind device work (NCCL), not done on return
  bool overlap_;
  std::vector<std::size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<float*> in_bucket_;
  double allreduce_ms_ = 0;  // enqueued_: the owner's; overlap_: GUARDED_BY(mutex_)

  std::mutex mutex_;
  std::condition_variable_any cv_;
  std::deque<std::size_t> queue_;  // GUARDED_BY(mutex_)
  std::size_t reduced_ = 0;        // GUARDED_BY(mutex_)
  std::exception_ptr error_;       // GUARDED_BY(mutex_)
  std::jthread thread_;
};

}  // namespace pstrain
