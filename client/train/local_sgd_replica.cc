#include "client/train/local_sgd_replica.h"

#include <chrono>
#include <vector>

#include "client/model/model.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The optimizer steps on the model's own gradients.
std::vector<float*> model_gradients(Model& model) {
  std::vector<float*> grads;
  for (std::size_t i = 0; i < model.variables().size(); ++i) grads.push_back(model.grad(i).data());
  return grads;
}

}  // namespace

LocalSgdReplica::LocalSgdReplica(Backend& backend, Model& model, Communicator& comm,
                                 const OptimizerConfig& optimizer, std::uint32_t local_steps,
                                 std::uint32_t accumulate_steps, int record_batch)
    : backend_(backend),
      model_(model),
      comm_(comm),
      local_steps_(local_steps),
      accumulator_(backend, model, accumulate_steps, record_batch),
      optimizer_(backend, model, optimizer, model_gradients(model), record_batch > 0) {}

void LocalSgdReplica::accumulate(int n) {
  if (scaler_) model_.set_loss_scale(scaler_->scale());
  accumulator_.add(n);
}

double LocalSgdReplica::issue(int n) {
  const auto t = Clock::now();
  if (scaler_) model_.set_loss_scale(scaler_->scale());
  accumulator_.finish(n, [](std::size_t) {});
  return ms_since(t);
}

SyncStepTimes LocalSgdReplica::finish(float lr_scale, bool last) {
  SyncStepTimes times;
  const auto& vars = model_.variables();
  const auto t_optimizer = Clock::now();
  bool finite = true;
  for (std::size_t i = 0; scaler_ && i < vars.size() && finite; ++i)
    finite = backend_.all_finite(model_.grad(i).data(), vars[i].size);
  steps_ += 1;
  if (!scaler_ || scaler_->update(finite)) optimizer_.step({steps_, lr_scale});
  const auto t_average = Clock::now();
  times.optimizer_ms = ms_since(t_optimizer);
  if (steps_ % local_steps_ == 0 || last) {
    average_weights();
    // Nothing overlaps the average: all of it is waited for.
    times.allreduce_ms = times.wait_ms = ms_since(t_average);
  }
  return times;
}

void LocalSgdReplica::average_weights() {
  const auto& vars = model_.variables();
  const float average = 1.0f / static_cast<float>(comm_.size());
  for (std::size_t i = 0; i < vars.size(); ++i) {
    comm_.allreduce_sum(model_.param(i).data(), vars[i].size);
    backend_.scale(model_.param(i).data(), average, vars[i].size);
  }
}

std::string LocalSgdReplica::describe() const {
  return "local SGD: weights averaged every " + std::to_string(local_steps_) + " steps by " +
         comm_.name() + " all-reduce over " + std::to_string(comm_.size()) + " workers";
}

}  // namespace pstrain
