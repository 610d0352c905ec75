// Every SIMD level of the optimizer's update loop computes the same bits, so
// sync replicas on CPUs with different instruction sets stay identical. Each
// level this CPU supports runs on the same random values, gradients and state
// for several steps of every optimizer, against the baseline level. The same
// holds for an update split across threads (optimizer.apply_threads).
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shared/optimizer.h"
#include "shared/optimizer_loops.h"
#include "shared/task_pool.h"

using namespace pstrain;

namespace {

// Odd, so the vectorized loops run their scalar remainder too.
constexpr std::size_t kElements = 1003;
constexpr std::uint64_t kSteps = 5;

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp may not be given the null data() of an empty vector (SGD has no state).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

OptimizerConfig config(OptimizerKind kind, bool nesterov) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = 0.05f;
  c.nesterov = nesterov;
  c.weight_decay = 0.01f;
  return c;
}

}  // namespace

TEST_CASE("optimizer: every SIMD level computes the same bits") {
  const auto loops = opt::update_loops();
  const opt::UpdateLoop& baseline = loops.back();
  REQUIRE(baseline.supported);
  for (const opt::UpdateLoop& loop : loops) {
    if (!loop.supported) MESSAGE("this CPU has no " << loop.name << "; not compared");
  }
  std::mt19937 rng(9);
  for (const auto& c : {config(OptimizerKind::sgd, false), config(OptimizerKind::momentum, false),
                        config(OptimizerKind::momentum, true), config(OptimizerKind::adam, false),
                        config(OptimizerKind::adagrad, false)}) {
    const Optimizer optimizer(c);
    const std::string name = std::string(to_string(c.kind)) + (c.nesterov ? " (nesterov)" : "");
    // Weights and a state already away from its starting value, as mid-run.
    const auto w0 = random_floats(kElements, rng, -1.0f, 1.0f);
    const auto state0 = random_floats(kElements * optimizer.state_slots(), rng, 0.01f, 0.5f);
    std::vector<std::vector<float>> w(loops.size(), w0), state(loops.size(), state0);
    for (std::uint64_t step = 1; step <= kSteps; ++step) {
      const auto g = random_floats(kElements, rng, -1.0f, 1.0f);
      const auto s = opt::OptimizerStep::make(c, kElements, step, 0.7f);
      for (std::size_t l = 0; l < loops.size(); ++l) {
        if (loops[l].supported)
          loops[l].run(s, w[l].data(), g.data(), state[l].data(), 0, kElements);
      }
      for (std::size_t l = 0; l + 1 < loops.size(); ++l) {
        if (!loops[l].supported) continue;
        INFO(name << ", step " << step << ": " << loops[l].name << " against " << baseline.name);
        CHECK(same_bits(w[l], w.back()));
        CHECK(same_bits(state[l], state.back()));
      }
    }
    CHECK(!same_bits(w.back(), w0));  // the steps did change the weights
  }
}

TEST_CASE("optimizer: an update split across threads computes the bits of one thread") {
  // Not a multiple of the 16-float ranges, so the last range is short.
  constexpr std::size_t n = 5 * Optimizer::kSplitElements + 7;
  std::mt19937 rng(11);
  TaskPool pool3(3), pool4(4);
  for (const auto& c :
       {config(OptimizerKind::sgd, false), config(OptimizerKind::momentum, true),
        config(OptimizerKind::adam, false), config(OptimizerKind::adagrad, false)}) {
    const Optimizer optimizer(c);
    INFO(to_string(c.kind));
    const auto w0 = random_floats(n, rng, -1.0f, 1.0f);
    const auto state0 = random_floats(n * optimizer.state_slots(), rng, 0.01f, 0.5f);
    std::vector<float> w1 = w0, w3 = w0, w4 = w0, s1 = state0, s3 = state0, s4 = state0;
    for (std::uint64_t step = 1; step <= kSteps; ++step) {
      const auto g = random_floats(n, rng, -1.0f, 1.0f);
      optimizer.apply(w1, g, s1, step, 0.7f);
      optimizer.apply(w3, g, s3, step, 0.7f, &pool3);
      optimizer.apply(w4, g, s4, step, 0.7f, &pool4);
    }
    CHECK(!same_bits(w1, w0));
    CHECK(same_bits(w3, w1));
    CHECK(same_bits(s3, s1));
    CHECK(same_bits(w4, w1));
    CHECK(same_bits(s4, s1));
  }
}
