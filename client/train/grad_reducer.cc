#include "client/train/grad_reducer.h"

#include <chrono>

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

std::vector<GradientBucket> gradient_buckets(const std::vector<VariableSpec>& vars,
                                             std::size_t bucket_bytes) {
  std::vector<GradientBucket> buckets;
  std::size_t bytes = 0;
  for (std::size_t i = vars.size(); i-- > 0;) {
    if (buckets.empty() || bytes >= bucket_bytes) {
      buckets.push_back({i, i, 0});
      bytes = 0;
    }
    buckets.back().first_variable = i;
    buckets.back().count += vars[i].size;
    bytes += vars[i].size * sizeof(float);
  }
  return buckets;
}

GradReducer::GradReducer(Backend& backend, const std::vector<VariableSpec>& vars,
                         Communicator& comm, std::size_t bucket_bytes, bool overlap)
    : backend_(backend),
      comm_(comm),
      enqueued_(!backend.host_accessible()),
      overlap_(overlap && backend.host_accessible()),
      bucket_of_(vars.size()),
      in_bucket_(vars.size()) {
  for (const auto& v : vars) sizes_.push_back(v.size);
  for (const GradientBucket& plan : gradient_buckets(vars, bucket_bytes)) {
    Bucket& b = buckets_.emplace_back(plan, backend.alloc(plan.count * sizeof(float)));
    float* at = b.data();
    for (std::size_t i = plan.first_variable; i <= plan.last_variable; ++i) {
      in_bucket_[i] = at;
      at += vars[i].size;
      bucket_of_[i] = buckets_.size() - 1;
    }
  }
  if (overlap_) thread_ = std::jthread([this](std::stop_token stop) { communicate(stop); });
}

void GradReducer::reduce(std::size_t bucket) {
  comm_.allreduce_sum(buckets_[bucket].data(), buckets_[bucket].plan.count);
}

void GradReducer::communicate(std::stop_token stop) {
  while (true) {
    std::size_t bucket;
    {
      std::unique_lock lock(mutex_);
      if (!cv_.wait(lock, stop, [&] { return !queue_.empty(); })) return;
      bucket = queue_.front();
      queue_.pop_front();
    }
    const auto t = Clock::now();
    std::exception_ptr error;
    try {
      reduce(bucket);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      allreduce_ms_ += ms_since(t);
      reduced_ += 1;
      if (error && !error_) error_ = error;
    }
    cv_.notify_all();
  }
}

void GradReducer::begin() {
  std::lock_guard lock(mutex_);
  reduced_ = 0;
  allreduce_ms_ = 0;
}

void GradReducer::add(std::size_t variable, const float* grad) {
  // axpby with a = 1 and b = 0 copies exactly, on the backend's own stream.
  backend_.axpby(1.0f, grad, 0.0f, in_bucket_[variable], sizes_[variable]);
  const std::size_t b = bucket_of_[variable];
  if (buckets_[b].plan.first_variable != variable) return;  // the bucket is not full yet
  if (overlap_) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(b);
    }
    cv_.notify_all();
  } else if (enqueued_) {  // NCCL: queued on its stream behind the copies, overlapping the rest
    const auto t = Clock::now();
    reduce(b);
    allreduce_ms_ += ms_since(t);
  }
}

double GradReducer::finish() {
  if (overlap_) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return reduced_ == buckets_.size(); });
    if (error_) std::rethrow_exception(error_);
    return allreduce_ms_;
  }
  if (!enqueued_) {
    const auto t = Clock::now();
    for (std::size_t b = 0; b < buckets_.size(); ++b) reduce(b);
    allreduce_ms_ = ms_since(t);
  }
  return allreduce_ms_;
}

void GradReducer::average() {
  const float average = 1.0f / static_cast<float>(comm_.size());
  for (const Bucket& b : buckets_) backend_.scale(b.data(), average, b.plan.count);
}

bool GradReducer::all_finite() const {
  for (const Bucket& b : buckets_)
    if (!backend_.all_finite(b.data(), b.plan.count)) return false;
  return true;
}

}  // namespace pstrain
