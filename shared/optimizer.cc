#include "shared/optimizer.h"

#include <cmath>
#include <stdexcept>

#include "shared/optimizer_math.h"

namespace pstrain {

std::string_view to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::momentum: return "momentum";
    case OptimizerKind::adam: return "adam";
    case OptimizerKind::adagrad: return "adagrad";
  }
  return "unknown";
}

OptimizerKind parse_optimizer_kind(std::string_view name) {
  for (auto kind : {OptimizerKind::sgd, OptimizerKind::momentum,
                    OptimizerKind::adam, OptimizerKind::adagrad}) {
    if (name == to_string(kind)) return kind;
  }
  throw std::invalid_argument("unknown optimizer '" + std::string(name) +
                              "' (expected sgd, momentum, adam or adagrad)");
}

Optimizer::Optimizer(OptimizerConfig config) : config_(config) {}

std::size_t Optimizer::state_slots() const {
  switch (config_.kind) {
    case OptimizerKind::sgd: return 0;
    case OptimizerKind::momentum: return 1;
    case OptimizerKind::adam: return 2;
    case OptimizerKind::adagrad: return 1;
  }
  return 0;
}

void Optimizer::init_state(std::span<float> state) const {
  const float start =
      config_.kind == OptimizerKind::adagrad ? config_.initial_accumulator : 0.0f;
  for (float& s : state) s = start;
}

// Compiled for AVX-512, AVX2 and the baseline; the loader picks the widest
// the CPU has (the ps spends most of a push here).
__attribute__((target_clones("avx512f", "avx2", "default")))
void Optimizer::apply(std::span<float> values, std::span<const float> grad,
                      std::span<float> state, std::uint64_t step,
                      float lr_scale) const {
  const std::size_t n = values.size();
  if (grad.size() != n || state.size() != n * state_slots()) {
    throw std::invalid_argument(
        "optimizer: " + std::to_string(n) + " values, " +
        std::to_string(grad.size()) + " gradients and " +
        std::to_string(state.size()) + " state floats do not match");
  }
  // A local copy of the hyper-parameters, and restrict on the arrays: the
  // compiler then knows no store in the loops changes them, and vectorizes.
  const OptimizerConfig c = config_;
  const float lr = c.lr * lr_scale;
  float* __restrict w = values.data();
  const float* __restrict g = grad.data();
  switch (c.kind) {
    case OptimizerKind::sgd:
      for (std::size_t i = 0; i < n; ++i) opt::sgd_step(w[i], g[i], lr, c.weight_decay);
      break;
    case OptimizerKind::momentum: {
      float* __restrict v = state.data();
      for (std::size_t i = 0; i < n; ++i)
        opt::momentum_step(w[i], v[i], g[i], lr, c.momentum, c.weight_decay, c.nesterov);
      break;
    }
    case OptimizerKind::adam: {
      float* __restrict m = state.data();
      float* __restrict v = state.data() + n;
      const auto t = static_cast<double>(step == 0 ? 1 : step);
      const auto bias1 = static_cast<float>(1.0 - std::pow(double(c.beta1), t));
      const auto bias2 = static_cast<float>(1.0 - std::pow(double(c.beta2), t));
      for (std::size_t i = 0; i < n; ++i)
        opt::adam_step(w[i], m[i], v[i], g[i], lr, c.beta1, c.beta2, c.eps, bias1,
                       bias2, c.weight_decay);
      break;
    }
    case OptimizerKind::adagrad: {
      float* __restrict acc = state.data();
      for (std::size_t i = 0; i < n; ++i)
        opt::adagrad_step(w[i], acc[i], g[i], lr, c.eps, c.weight_decay);
      break;
    }
  }
}

}  // namespace pstrain
