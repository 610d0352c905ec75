// Optimizers against values worked out by hand: w = 1, lr = 0.1, gradients
// 0.5, 0.2, -0.4, and the intermediate state written out in the comments.
#include <doctest/doctest.h>

#include <array>
#include <stdexcept>
#include <vector>

#include "shared/optimizer.h"

using namespace pstrain;

namespace {

constexpr std::array<float, 3> kGrads{0.5f, 0.2f, -0.4f};

// Applies the three gradients to a single weight starting at 1 and returns
// the weight after each step, plus the final state.
struct Trace {
  std::array<float, 3> w{};
  std::vector<float> state;
};

Trace run(OptimizerConfig config) {
  config.lr = 0.1f;
  const Optimizer opt(config);
  std::vector<float> w{1.0f};
  Trace t;
  t.state.resize(opt.state_slots());
  opt.init_state(t.state);
  for (std::size_t s = 0; s < kGrads.size(); ++s) {
    opt.apply(w, std::span<const float>(&kGrads[s], 1), t.state, s + 1);
    t.w[s] = w[0];
  }
  return t;
}

OptimizerConfig with(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  return c;
}

}  // namespace

TEST_CASE("optimizer: sgd, with and without weight decay") {
  // w -= 0.1 * g: 0.95, 0.93, 0.97.
  auto t = run(with(OptimizerKind::sgd));
  CHECK(t.w[0] == doctest::Approx(0.95).epsilon(1e-6));
  CHECK(t.w[1] == doctest::Approx(0.93).epsilon(1e-6));
  CHECK(t.w[2] == doctest::Approx(0.97).epsilon(1e-6));
  CHECK(t.state.empty());
  // w -= 0.1 * (g + 0.01 w): 1 - 0.1*0.51 = 0.949; 0.949 - 0.1*(0.2 + 0.00949)
  // = 0.928051; 0.928051 - 0.1*(-0.4 + 0.00928051) = 0.967122949.
  auto c = with(OptimizerKind::sgd);
  c.weight_decay = 0.01f;
  t = run(c);
  CHECK(t.w[0] == doctest::Approx(0.949).epsilon(1e-6));
  CHECK(t.w[1] == doctest::Approx(0.928051).epsilon(1e-6));
  CHECK(t.w[2] == doctest::Approx(0.967122949).epsilon(1e-6));
}

TEST_CASE("optimizer: heavy-ball momentum") {
  // v = 0.9 v + g: 0.5, 0.65, 0.185; w -= 0.1 v: 0.95, 0.885, 0.8665.
  const auto t = run(with(OptimizerKind::momentum));
  CHECK(t.w[0] == doctest::Approx(0.95).epsilon(1e-6));
  CHECK(t.w[1] == doctest::Approx(0.885).epsilon(1e-6));
  CHECK(t.w[2] == doctest::Approx(0.8665).epsilon(1e-6));
  REQUIRE(t.state.size() == 1);
  CHECK(t.state[0] == doctest::Approx(0.185).epsilon(1e-6));
}

TEST_CASE("optimizer: nesterov momentum") {
  // Same v; w -= 0.1 (g + 0.9 v): 1 - 0.1*0.95 = 0.905; 0.905 - 0.1*0.785 =
  // 0.8265; 0.8265 - 0.1*(-0.4 + 0.1665) = 0.84985.
  auto c = with(OptimizerKind::momentum);
  c.nesterov = true;
  const auto t = run(c);
  CHECK(t.w[0] == doctest::Approx(0.905).epsilon(1e-6));
  CHECK(t.w[1] == doctest::Approx(0.8265).epsilon(1e-6));
  CHECK(t.w[2] == doctest::Approx(0.84985).epsilon(1e-6));
}

TEST_CASE("optimizer: adam with bias correction") {
  // Step 1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25, w = 1 - 0.1*0.5/0.5 = 0.9.
  // Step 2: m = 0.065, v = 0.00028975, m^ = 0.065/0.19, v^ = 0.00028975/0.001999,
  //         w = 0.9 - 0.1 * 0.342105 / 0.380720 = 0.810142.
  // Step 3: m = 0.0185, v = 0.00044946025, bias 0.271 / 0.002997001,
  //         w = 0.792515.
  const auto t = run(with(OptimizerKind::adam));
  CHECK(t.w[0] == doctest::Approx(0.9).epsilon(1e-6));
  CHECK(t.w[1] == doctest::Approx(0.8101424839).epsilon(1e-6));
  CHECK(t.w[2] == doctest::Approx(0.7925145982).epsilon(1e-6));
  REQUIRE(t.state.size() == 2);
  CHECK(t.state[0] == doctest::Approx(0.0185).epsilon(1e-6));
  CHECK(t.state[1] == doctest::Approx(0.00044946025).epsilon(1e-6));
}

TEST_CASE("optimizer: adagrad from its initial accumulator") {
  // acc = 0.1 + g^2: 0.35, 0.39, 0.55; w -= 0.1 g / sqrt(acc):
  // 1 - 0.05/0.591608 = 0.915485; - 0.02/0.624500 = 0.883459; + 0.04/0.741620 = 0.937395.
  const auto t = run(with(OptimizerKind::adagrad));
  CHECK(t.w[0] == doctest::Approx(0.9154845760).epsilon(1e-6));
  CHECK(t.w[1] == doctest::Approx(0.8834589457).epsilon(1e-6));
  CHECK(t.w[2] == doctest::Approx(0.9373949340).epsilon(1e-6));
  REQUIRE(t.state.size() == 1);
  CHECK(t.state[0] == doctest::Approx(0.55).epsilon(1e-6));
}

TEST_CASE("optimizer: mismatched spans and unknown names are refused") {
  const Optimizer adam(with(OptimizerKind::adam));
  std::vector<float> w(4), g(3), s(8);
  CHECK_THROWS_AS(adam.apply(w, g, s, 1), std::invalid_argument);
  g.resize(4);
  s.resize(4);
  CHECK_THROWS_AS(adam.apply(w, g, s, 1), std::invalid_argument);
  CHECK_THROWS_WITH(parse_optimizer_kind("rmsprop"), doctest::Contains("adam"));
  CHECK(parse_optimizer_kind("adagrad") == OptimizerKind::adagrad);
}
