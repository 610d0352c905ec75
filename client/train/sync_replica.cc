#include "client/train/sync_replica.h"

#include <chrono>
#include <vector>

#include "client/model/model.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Where the optimizer finds each gradient: its place in its bucket, which
// the all-reduce sums in place.
std::vector<float*> bucket_gradients(const GradReducer& reducer, std::size_t variables) {
  std::vector<float*> grads;
  for (std::size_t i = 0; i < variables; ++i) grads.push_back(reducer.gradient(i));
  return grads;
}

}  // namespace

SyncReplica::SyncReplica(Backend& backend, Model& model, Communicator& comm,
                         const OptimizerConfig& optimizer, std::size_t bucket_bytes, bool overlap,
                         std::uint32_t accumulate_steps, int record_batch)
    : backend_(backend),
      model_(model),
      comm_(comm),
      reducer_(backend, model.variables(), comm, bucket_bytes, overlap),
      accumulator_(backend, model, accumulate_steps, record_batch),
      optimizer_(backend, model, optimizer, bucket_gradients(reducer_, model.variables().size()),
                 record_batch > 0, [this] { reducer_.average(); }) {}

void SyncReplica::accumulate(int n) {
  if (scaler_) model_.set_loss_scale(scaler_->scale());
  accumulator_.add(n);
}

double SyncReplica::issue(int n) {
  const auto t = Clock::now();
  reducer_.begin();
  if (scaler_) model_.set_loss_scale(scaler_->scale());
  accumulator_.finish(n, [&](std::size_t i) { reducer_.add(i, model_.grad(i).data()); });
  comm_.mark();  // the end of backward, for communicators that time on the device
  return ms_since(t);
}

SyncStepTimes SyncReplica::finish(float lr_scale, bool) {
  SyncStepTimes times;
  const auto t_backward = Clock::now();
  times.allreduce_ms = reducer_.finish();
  const auto t_reduced = Clock::now();
  times.wait_ms = ms_since(t_backward);
  if (scaler_ && !scaler_->update(reducer_.all_finite())) return times;
  steps_ += 1;
  optimizer_.step({steps_, lr_scale});
  times.optimizer_ms = ms_since(t_reduced);
  return times;
}

std::string SyncReplica::describe() const {
  return "sync mode: " + comm_.name() + " all-reduce over " + std::to_string(comm_.size()) +
         " workers, " + std::to_string(buckets()) + " buckets";
}

}  // namespace pstrain
