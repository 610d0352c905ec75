#pragma once
// Optimizers over a contiguous range of float32 values. State lives beside the
// values it updates (a chunk on the ps, a variable in a sync-mode replica) as
// `state_slots()` arrays of the same length, laid out slot-major:
// state[s * n + i] is slot s of element i.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "shared/row_optimizer.h"

namespace pstrain {

class TaskPool;

enum class OptimizerKind { sgd, momentum, adam, adagrad };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 0.1f;
  float momentum = 0.9f;             // momentum
  bool nesterov = false;             // momentum
  float beta1 = 0.9f;                // adam
  float beta2 = 0.999f;              // adam
  float eps = 1e-8f;                 // adam, adagrad
  float initial_accumulator = 0.1f;  // adagrad
  float weight_decay = 0.0f;
  // Asynchronous modes: each pushed gradient's learning rate divided by its
  // staleness (the updates its chunk took between the worker's pull and its
  // push; 0 and 1 leave it), as in Zhang et al., "Staleness-aware
  // async-SGD" (IJCAI 2016). The tables' rows are not scaled.
  bool staleness_lr = false;
  // Threads each ps applies one large chunk's update with (TaskPool); 0:
  // auto, the cores its host has to spare (ps_apply_threads in
  // shared/config.h).
  std::uint32_t apply_threads = 0;
  // optimizer.sparse: the embedding tables' row optimizer (adagrad unless
  // set), with keys of its own.
  RowOptimizerConfig sparse = {};
};

// One tensor of a multi-tensor update (Backend::apply_optimizers): n
// values w, their gradient g and their state (state_slots() x n floats,
// slot-major; null for SGD).
struct OptimizerTensor {
  float* w = nullptr;
  const float* g = nullptr;
  float* state = nullptr;
  std::size_t n = 0;
};

std::string_view to_string(OptimizerKind kind);
// Throws std::invalid_argument naming the accepted names.
OptimizerKind parse_optimizer_kind(std::string_view name);

class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig config);

  const OptimizerConfig& config() const { return config_; }

  // Floats of state per element: 0 for SGD, 1 for momentum and Adagrad, 2 for Adam.
  std::size_t state_slots() const;

  // Sets freshly created state to its starting value (zeros, or Adagrad's
  // initial accumulator).
  void init_state(std::span<float> state) const;

  // Applies one update w <- step(w, g). `step` is the 1-based number of this
  // update for these values (Adam's bias correction); `lr_scale` multiplies
  // the configured learning rate (warm-up and linear scaling in sync mode).
  // With a `pool`, values of at least kSplitElements are cut into ranges
  // updated on its threads at once: the update is element-wise, so the bits
  // are those of one thread. Throws std::invalid_argument when the spans'
  // sizes disagree.
  void apply(std::span<float> values, std::span<const float> grad, std::span<float> state,
             std::uint64_t step, float lr_scale = 1.0f, TaskPool* pool = nullptr) const;

  // Below this many elements a split costs more in waking threads than the
  // update it shares out (a 64 KiB range takes a few microseconds).
  static constexpr std::size_t kSplitElements = 32 * 1024;

 private:
  OptimizerConfig config_;
};

}  // namespace pstrain
