// The straggler schedule (client/train/straggler.h): which workers sleep after a
// step and for how long, checked against delays worked out by hand from a
// step's draw, and the draws against the properties a schedule needs
// (deterministic per seed, worker and step; uniform; its own per worker).
#include <doctest/doctest.h>

#include <cmath>

#include "client/train/straggler.h"

using namespace pstrain;

namespace {

TrainConfig straggler(std::int32_t worker, double delay, double jitter = 0,
                      double pause_probability = 0, double pause = 0) {
  TrainConfig t;
  t.straggler_worker = worker;
  t.straggler_delay_ms = delay;
  t.straggler_jitter_ms = jitter;
  t.straggler_pause_probability = pause_probability;
  t.straggler_pause_ms = pause;
  return t;
}

}  // namespace

TEST_CASE("straggler: only the named worker, or every one with all, is slowed") {
  const TrainConfig one = straggler(1, 30);
  CHECK_FALSE(straggles(one, 0));
  CHECK(straggles(one, 1));
  CHECK_FALSE(straggles(one, 2));
  CHECK(straggler_delay_ms(one, 0, 7) == 0);
  CHECK(straggler_delay_ms(one, 1, 7) == 30);
  for (std::uint32_t w : {0u, 1u, 5u}) {
    CHECK(straggles(straggler(kEveryWorker, 30), w));
    CHECK_FALSE(straggles(straggler(-1, 30), w));
  }
  // Named, but nothing to slow it by: no straggler (and no sleeping).
  CHECK_FALSE(straggles(straggler(1, 0), 1));
  CHECK_FALSE(straggles(straggler(1, 0, 0, 0.5, 0), 1));
  CHECK_FALSE(straggles(straggler(1, 0, 0, 0, 200), 1));
  CHECK(straggles(straggler(1, 0, 5), 1));
  CHECK(straggles(straggler(1, 0, 0, 0.05, 200), 1));
}

TEST_CASE("straggler: a step's delay from its draw, by hand") {
  // 30 ms +- 20 ms, and a 200 ms pause on 5% of the steps.
  const TrainConfig t = straggler(1, 30, 20, 0.05, 200);
  CHECK(straggler_delay_ms(t, {.jitter = 0.25, .pause = 0.9}) == 20);   // 30 + 20 * -0.5
  CHECK(straggler_delay_ms(t, {.jitter = 0.75, .pause = 0.05}) == 40);  // not below 0.05
  CHECK(straggler_delay_ms(t, {.jitter = 0.5, .pause = 0.5}) == 30);
  CHECK(straggler_delay_ms(t, {.jitter = 0.0, .pause = 0.01}) == 210);  // 10 + the pause
  CHECK(straggler_delay_ms(t, {.jitter = 0.875, .pause = 0.04}) == 245);
  // A jitter larger than the delay is clamped at 0, the pause still added.
  const TrainConfig wide = straggler(1, 5, 20, 0.5, 100);
  CHECK(straggler_delay_ms(wide, {.jitter = 0.0, .pause = 0.9}) == 0);    // 5 - 20
  CHECK(straggler_delay_ms(wide, {.jitter = 0.125, .pause = 0.9}) == 0);  // 5 - 15
  CHECK(straggler_delay_ms(wide, {.jitter = 0.5, .pause = 0.9}) == 5);
  CHECK(straggler_delay_ms(wide, {.jitter = 0.0, .pause = 0.25}) == 100);  // 0 + 100
  CHECK(straggler_delay_ms(wide, {.jitter = 1.0, .pause = 0.25}) == 125);  // 25 + 100
  // Without jitter or pauses the delay is fixed, whatever the draw.
  const TrainConfig fixed = straggler(0, 30);
  CHECK(straggler_delay_ms(fixed, {.jitter = 0.0, .pause = 0.0}) == 30);
  CHECK(straggler_delay_ms(fixed, {.jitter = 0.99, .pause = 0.99}) == 30);
  for (std::uint64_t step = 1; step <= 1000; ++step)
    CHECK(straggler_delay_ms(fixed, 0, step) == 30);
  // Probability 1 pauses every step, 0 none.
  const TrainConfig always = straggler(kEveryWorker, 0, 0, 1, 50);
  const TrainConfig never = straggler(kEveryWorker, 10, 0, 0, 50);
  for (std::uint64_t step = 1; step <= 1000; ++step) {
    CHECK(straggler_delay_ms(always, 3, step) == 50);
    CHECK(straggler_delay_ms(never, 3, step) == 10);
  }
}

TEST_CASE("straggler: the draws are a function of seed, worker and step") {
  const StragglerDraw a = straggler_draw(42, 1, 17);
  const StragglerDraw b = straggler_draw(42, 1, 17);
  CHECK(a.jitter == b.jitter);
  CHECK(a.pause == b.pause);
  CHECK(a.jitter != a.pause);
  CHECK(straggler_draw(43, 1, 17).jitter != a.jitter);
  CHECK(straggler_draw(42, 0, 17).jitter != a.jitter);
  CHECK(straggler_draw(42, 1, 18).jitter != a.jitter);
  // The whole-run function uses train.seed.
  TrainConfig t = straggler(kEveryWorker, 30, 20);
  t.seed = 42;
  CHECK(straggler_delay_ms(t, 1, 17) == straggler_delay_ms(t, a));
}

TEST_CASE("straggler: over many steps the draws are uniform and the pauses as frequent as asked") {
  TrainConfig t = straggler(kEveryWorker, 30, 20, 0.05, 200);
  t.seed = 7;
  constexpr int kSteps = 20000;
  for (std::uint32_t worker : {0u, 1u}) {
    INFO("worker ", worker);
    int pauses = 0, low_quarter = 0;
    double sum = 0;
    for (std::uint64_t step = 1; step <= kSteps; ++step) {
      const StragglerDraw d = straggler_draw(t.seed, worker, step);
      REQUIRE(d.jitter >= 0);
      REQUIRE(d.jitter < 1);
      REQUIRE(d.pause >= 0);
      REQUIRE(d.pause < 1);
      const double ms = straggler_delay_ms(t, worker, step);
      const bool paused = ms >= 200;
      const double jittered = paused ? ms - 200 : ms;
      REQUIRE(jittered >= 10);
      REQUIRE(jittered < 50);
      pauses += paused;
      low_quarter += jittered < 20;
      sum += jittered;
    }
    // Binomial standard deviations: 0.0015 for the pauses, 0.003 for the
    // quarter; 0.08 ms for the mean (uniform over 40 ms). Bounds of 6 or more.
    CHECK(std::abs(pauses / double(kSteps) - 0.05) < 0.01);
    CHECK(std::abs(low_quarter / double(kSteps) - 0.25) < 0.02);
    CHECK(std::abs(sum / kSteps - 30) < 0.5);
  }
  // Every worker its own schedule: two workers pause on different steps.
  int same = 0;
  for (std::uint64_t step = 1; step <= 1000; ++step)
    same += straggler_delay_ms(t, 0, step) == straggler_delay_ms(t, 1, step);
  CHECK(same < 10);
}
