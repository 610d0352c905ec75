#include "client/train/replica_optimizer.h"

#include <utility>

#include "client/model/model.h"
#include "shared/optimizer.h"

namespace pstrain {

ReplicaOptimizer::ReplicaOptimizer(Backend& backend, Model& model, const OptimizerConfig& optimizer,
                                   const std::vector<float*>& grads, bool record,
                                   std::function<void()> prepare)
    : backend_(backend), optimizer_(optimizer), prepare_(std::move(prepare)) {
  const auto& vars = model.variables();
  const std::size_t slots = Optimizer(optimizer).state_slots();
  std::size_t total = 0;
  for (const auto& v : vars) total += v.size;
  if (slots > 0) {
    std::vector<float> initial(total * slots);
    Optimizer(optimizer).init_state(initial);
    state_ = backend.alloc(initial.size() * sizeof(float));
    backend.upload(initial.data(), state_.data(), initial.size() * sizeof(float));
    backend.synchronize();
  }
  std::size_t offset = 0;  // of the variable's state in state_, / slots
  for (std::size_t i = 0; i < vars.size(); ++i) {
    tensors_.push_back({model.param(i).data(), grads.at(i),
                        slots > 0 ? state_.data() + offset * slots : nullptr, vars[i].size});
    offset += vars[i].size;
  }
  if (record)
    graphs_.emplace(backend, 0, "optimizer step", [this](int, const StepScalars& s) { apply(s); });
}

void ReplicaOptimizer::step(const StepScalars& scalars) {
  if (graphs_)
    graphs_->run(0, scalars);
  else
    apply(scalars);
}

void ReplicaOptimizer::apply(const StepScalars& scalars) {
  if (prepare_) prepare_();
  backend_.apply_optimizers(optimizer_, tensors_, scalars.step, scalars.lr_scale);
}

}  // namespace pstrain
