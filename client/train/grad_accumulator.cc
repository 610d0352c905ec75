#include "client/train/grad_accumulator.h"

#include <stdexcept>
#include <string>

#include "client/model/model.h"

namespace pstrain {

GradAccumulator::GradAccumulator(Backend& backend, Model& model, std::uint32_t steps,
                                 int record_batch)
    : backend_(backend), model_(model) {
  if (record_batch > 0) {
    if (steps > 1)
      throw std::invalid_argument("recorded steps take one micro-batch each, not " +
                                  std::to_string(steps));
    graphs_.emplace(
        backend, record_batch, "forward and backward",
        [&model](int n, const StepScalars&) { model.forward_backward(n, [](std::size_t) {}); });
  }
  if (steps < 2) return;
  for (const auto& v : model.variables()) sums_.push_back(backend.alloc(v.size * sizeof(float)));
}

void GradAccumulator::add(int n) {
  const auto& vars = model_.variables();
  const float weight = static_cast<float>(n) / model_.loss_scale();
  model_.forward_backward(n, [&](std::size_t i) {
    backend_.axpby(weight, model_.grad(i).data(), samples_ > 0 ? 1.0f : 0.0f, sums_.at(i).data(),
                   vars[i].size);
  });
  samples_ += n;
}

void GradAccumulator::finish(int n,
                             const std::function<void(std::size_t variable)>& on_grad_issued) {
  const auto& vars = model_.variables();
  if (graphs_) {
    graphs_->run(n, {});
    for (std::size_t i = vars.size(); i-- > 0;) on_grad_issued(i);
    return;
  }
  const double total = samples_ + n;
  const double scale = model_.loss_scale();
  model_.forward_backward(n, [&](std::size_t i) {
    if (samples_ > 0)
      backend_.axpby(static_cast<float>(1 / total), sums_[i].data(),
                     static_cast<float>(n / (total * scale)), model_.grad(i).data(), vars[i].size);
    else if (scale != 1)
      backend_.scale(model_.grad(i).data(), static_cast<float>(1 / scale), vars[i].size);
    on_grad_issued(i);
  });
  samples_ = 0;
}

}  // namespace pstrain
