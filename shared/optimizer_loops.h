#pragma once
// The optimizer's update loop, compiled once per x86-64 SIMD level (the ps
// spends most of a push here). Optimizer::apply runs the widest level the CPU
// has. This code is compiled without floating-point contraction
// (-ffp-contract=off, see shared/CMakeLists.txt): were the AVX-512 level to
// fuse multiply-adds into FMA while the AVX2 and baseline levels cannot, sync
// replicas on different CPUs would drift apart. So every level computes the
// same bits, which tests/unit/test_optimizer_bits.cc checks by running each.
#include <cstddef>
#include <span>
#include <string_view>

#include "shared/optimizer_math.h"

namespace pstrain::opt {

struct UpdateLoop {
  std::string_view name;  // "avx512f", "avx2" or "baseline"
  bool supported;         // whether this CPU can run it
  // Applies `step` to w[begin, end) (end <= step.n), with g and the
  // slot-major state beside: ranges that split [0, step.n) may run on
  // different threads and give the bits one run over all of it gives.
  void (*run)(const OptimizerStep& step, float* w, const float* g, float* state, std::size_t begin,
              std::size_t end);
};

// Every compiled level, widest first; the last (baseline) runs everywhere.
std::span<const UpdateLoop> update_loops();

// The widest level this CPU supports, picked once.
const UpdateLoop& best_update_loop();

}  // namespace pstrain::opt
