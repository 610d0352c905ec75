#include "shared/optimizer.h"

#include <algorithm>
#include <stdexcept>

#include "shared/optimizer_loops.h"
#include "shared/task_pool.h"

namespace pstrain {

std::string_view to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd:
      return "sgd";
    case OptimizerKind::momentum:
      return "momentum";
    case OptimizerKind::adam:
      return "adam";
    case OptimizerKind::adagrad:
      return "adagrad";
  }
  return "unknown";
}

OptimizerKind parse_optimizer_kind(std::string_view name) {
  for (auto kind :
       {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam, OptimizerKind::adagrad}) {
    if (name == to_string(kind)) return kind;
  }
  throw std::invalid_argument("unknown optimizer '" + std::string(name) +
                              "' (expected sgd, momentum, adam or adagrad)");
}

Optimizer::Optimizer(OptimizerConfig config) : config_(config) {}

std::size_t Optimizer::state_slots() const {
  return opt::dispatch(config_.kind, [](auto kind) { return kind.state_slots; });
}

void Optimizer::init_state(std::span<float> state) const {
  const float start = config_.kind == OptimizerKind::adagrad ? config_.initial_accumulator : 0.0f;
  for (float& s : state) s = start;
}

void Optimizer::apply(std::span<float> values, std::span<const float> grad, std::span<float> state,
                      std::uint64_t step, float lr_scale, TaskPool* pool) const {
  const std::size_t n = values.size();
  if (grad.size() != n || state.size() != n * state_slots()) {
    throw std::invalid_argument("optimizer: " + std::to_string(n) + " values, " +
                                std::to_string(grad.size()) + " gradients and " +
                                std::to_string(state.size()) + " state floats do not match");
  }
  const auto s = opt::OptimizerStep::make(config_, n, step, lr_scale);
  const auto& loop = opt::best_update_loop();
  const std::size_t parts =
      pool ? std::min(pool->threads(), std::max<std::size_t>(1, n / (kSplitElements / 2))) : 1;
  if (parts <= 1 || n < kSplitElements)
    return loop.run(s, values.data(), grad.data(), state.data(), 0, n);
  // Ranges of whole 64-byte lines, so no two threads write one cache line.
  constexpr std::size_t kLine = 64 / sizeof(float);
  const std::size_t per_part = (n / parts + kLine - 1) / kLine * kLine;
  pool->run(parts, [&](std::size_t part) {
    const std::size_t begin = std::min(n, part * per_part);
    const std::size_t end = part + 1 == parts ? n : std::min(n, begin + per_part);
    loop.run(s, values.data(), grad.data(), state.data(), begin, end);
  });
}

}  // namespace pstrain
