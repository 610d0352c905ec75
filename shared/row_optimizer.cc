#include "shared/row_optimizer.h"

#include <bit>
#include <cmath>
#include <stdexcept>

#include "shared/optimizer_math.h"

namespace pstrain {

std::string_view to_string(RowOptimizerKind kind) {
  switch (kind) {
    case RowOptimizerKind::sgd:
      return "sgd";
    case RowOptimizerKind::adagrad:
      return "adagrad";
    case RowOptimizerKind::rowwise_adagrad:
      return "rowwise_adagrad";
    case RowOptimizerKind::lazy_adam:
      return "lazy_adam";
    case RowOptimizerKind::ftrl:
      break;
  }
  return "ftrl";
}

RowOptimizerKind row_optimizer_kind(std::string_view name) {
  for (auto kind :
       {RowOptimizerKind::sgd, RowOptimizerKind::adagrad, RowOptimizerKind::rowwise_adagrad,
        RowOptimizerKind::lazy_adam, RowOptimizerKind::ftrl})
    if (to_string(kind) == name) return kind;
  throw std::invalid_argument("unknown sparse optimizer '" + std::string(name) +
                              "' (sgd, adagrad, rowwise_adagrad, lazy_adam, ftrl)");
}

namespace {

std::size_t state_floats_of(RowOptimizerKind kind, std::uint32_t dim) {
  switch (kind) {
    case RowOptimizerKind::sgd:
      return 0;
    case RowOptimizerKind::adagrad:
      return dim;
    case RowOptimizerKind::rowwise_adagrad:
      return 1;
    case RowOptimizerKind::lazy_adam:
      return 1 + 2 * std::size_t{dim};  // the step count (its bits), m, v
    case RowOptimizerKind::ftrl:
      break;
  }
  return 2 * std::size_t{dim};  // z, n
}

}  // namespace

RowOptimizer::RowOptimizer(RowOptimizerConfig config, std::uint32_t dim)
    : config_(config), dim_(dim), state_floats_(state_floats_of(config.kind, dim)) {}

void RowOptimizer::init_state(std::span<float> state) const {
  const bool accumulates = config_.kind == RowOptimizerKind::adagrad ||
                           config_.kind == RowOptimizerKind::rowwise_adagrad;
  for (auto& s : state) s = accumulates ? config_.initial_accumulator : 0.0f;
}

void RowOptimizer::update(std::span<float> w, std::span<float> state,
                          std::span<const float> g) const {
  const auto& c = config_;
  const std::size_t d = dim_;
  switch (c.kind) {
    case RowOptimizerKind::sgd:
      for (std::size_t j = 0; j < d; ++j) w[j] -= c.lr * g[j];
      return;
    case RowOptimizerKind::adagrad:
      for (std::size_t j = 0; j < d; ++j) opt::adagrad_step(w[j], state[j], g[j], c.lr, c.eps, 0);
      return;
    case RowOptimizerKind::rowwise_adagrad: {
      float squares = 0;
      for (std::size_t j = 0; j < d; ++j) squares += g[j] * g[j];
      state[0] += squares / static_cast<float>(d);
      const float rate = c.lr / (std::sqrt(state[0]) + c.eps);
      for (std::size_t j = 0; j < d; ++j) w[j] -= rate * g[j];
      return;
    }
    case RowOptimizerKind::lazy_adam: {
      // The row's step count, kept as the bits of state[0].
      const std::uint32_t t = std::bit_cast<std::uint32_t>(state[0]) + 1;
      state[0] = std::bit_cast<float>(t);
      const auto bias1 = static_cast<float>(1.0 - opt::power(c.beta1, t));
      const auto bias2 = static_cast<float>(1.0 - opt::power(c.beta2, t));
      float* m = state.data() + 1;
      float* v = m + d;
      for (std::size_t j = 0; j < d; ++j)
        opt::adam_step(w[j], m[j], v[j], g[j], c.lr, c.beta1, c.beta2, c.eps, bias1, bias2, 0);
      return;
    }
    case RowOptimizerKind::ftrl: {
      float* z = state.data();
      float* n = z + d;
      for (std::size_t j = 0; j < d; ++j) {
        const float n_new = n[j] + g[j] * g[j];
        const float sigma = (std::sqrt(n_new) - std::sqrt(n[j])) / c.lr;
        z[j] += g[j] - sigma * w[j];
        n[j] = n_new;
        w[j] = std::fabs(z[j]) <= c.l1 ? 0.0f
                                       : -(z[j] - std::copysign(c.l1, z[j])) /
                                             ((c.ftrl_beta + std::sqrt(n[j])) / c.lr + c.l2);
      }
      return;
    }
  }
}

}  // namespace pstrain
