#pragma once
// Row-wise optimizers for embedding tables (optimizer.sparse): each update
// touches the rows a batch looked up and nothing else, and a row's state
// lives beside its values (server's table store keeps both in one entry).
//
//   kind             state per row                 update of a touched row
//   sgd              none                          w -= lr g
//   adagrad          dim accumulators              a += g^2; w -= lr g / (sqrt(a) + eps)
//   rowwise_adagrad  1 accumulator                 a += mean(g^2); w -= lr g / (sqrt(a) + eps)
//   lazy_adam        step, dim m, dim v            Adam with the row's own step count
//   ftrl             dim z, dim n                  FTRL-proximal (McMahan et al., 2013)
//
// Lazy Adam counts steps per row, updated only when the row is touched (a
// row's bias corrections follow its own updates, as TensorFlow's LazyAdam
// and PyTorch's SparseAdam update only touched rows). FTRL keeps z and n
// per element and computes the weight from them: exactly 0 while |z| <= l1.
//
// Every update is plain scalar float code compiled once, so the bits are
// the same on every CPU, whatever its SIMD level.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace pstrain {

enum class RowOptimizerKind { sgd, adagrad, rowwise_adagrad, lazy_adam, ftrl };

std::string_view to_string(RowOptimizerKind kind);
// Throws std::invalid_argument naming the accepted kinds.
RowOptimizerKind row_optimizer_kind(std::string_view name);

struct RowOptimizerConfig {
  RowOptimizerKind kind = RowOptimizerKind::adagrad;
  float lr = 0.01f;                  // ftrl: alpha
  float eps = 1e-8f;                 // adagrad, rowwise_adagrad, lazy_adam
  float initial_accumulator = 0.0f;  // adagrad, rowwise_adagrad
  float beta1 = 0.9f, beta2 = 0.999f;
  float ftrl_beta = 1.0f;  // ftrl's beta (its learning-rate schedule's offset)
  float l1 = 0.0f, l2 = 0.0f;
};

class RowOptimizer {
 public:
  RowOptimizer(RowOptimizerConfig config, std::uint32_t dim);

  const RowOptimizerConfig& config() const { return config_; }
  // Floats of state a row of `dim` needs beside its values.
  std::size_t state_floats() const { return state_floats_; }
  // A new row's state (the accumulators' initial value, zero moments).
  void init_state(std::span<float> state) const;
  // Applies `grad` (dim floats) to row `values` with its `state`.
  void update(std::span<float> values, std::span<float> state, std::span<const float> grad) const;

 private:
  RowOptimizerConfig config_;
  std::uint32_t dim_;
  std::size_t state_floats_;
};

}  // namespace pstrain
