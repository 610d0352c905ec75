#include "shared/optimizer_loops.h"

#include <algorithm>
#include <array>

namespace pstrain::opt {
namespace {

// restrict on the arrays and a local copy of the step: the compiler then
// knows no store in the loop changes the other arrays or the
// hyper-parameters, and vectorizes.
void update(const OptimizerStep& step, float* __restrict w, const float* __restrict g,
            float* __restrict state, std::size_t begin, std::size_t end) {
  const OptimizerStep s = step;
  dispatch(s.kind, [&](auto kind) {
    for (std::size_t i = begin; i < end; ++i) s.apply(kind, i, w[i], g[i], state);
  });
}

// One function per level. flatten inlines every call inside (update, the
// dispatch, the steps), so the whole loop is compiled with that level's
// instructions rather than called out of line at the baseline.
[[gnu::flatten, gnu::target("avx512f")]] void update_avx512f(const OptimizerStep& s, float* w,
                                                             const float* g, float* state,
                                                             std::size_t begin, std::size_t end) {
  update(s, w, g, state, begin, end);
}

[[gnu::flatten, gnu::target("avx2")]] void update_avx2(const OptimizerStep& s, float* w,
                                                       const float* g, float* state,
                                                       std::size_t begin, std::size_t end) {
  update(s, w, g, state, begin, end);
}

[[gnu::flatten]] void update_baseline(const OptimizerStep& s, float* w, const float* g,
                                      float* state, std::size_t begin, std::size_t end) {
  update(s, w, g, state, begin, end);
}

}  // namespace

std::span<const UpdateLoop> update_loops() {
  static const std::array<UpdateLoop, 3> loops = [] {
    __builtin_cpu_init();  // in case this runs before the CPU model's constructor
    return std::array<UpdateLoop, 3>{{
        {"avx512f", __builtin_cpu_supports("avx512f") != 0, update_avx512f},
        {"avx2", __builtin_cpu_supports("avx2") != 0, update_avx2},
        {"baseline", true, update_baseline},
    }};
  }();
  return loops;
}

const UpdateLoop& best_update_loop() {
  // The baseline is always supported, so the search always finds one.
  static const UpdateLoop& best = *std::ranges::find_if(update_loops(), &UpdateLoop::supported);
  return best;
}

}  // namespace pstrain::opt
