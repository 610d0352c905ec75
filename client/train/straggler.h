#pragma once
// Stragglers on purpose (train.straggler_* in docs/config.md): how long a
// worker sleeps after each step, so that the modes can be compared with a
// slow worker, a noisy one (a delay give or take a jitter) or rare long
// pauses (a preempted host, a garbage collection).
//
// A step's delay is a pure function of the configuration, the worker index
// and the step number: its random parts come from a counter-based generator
// keyed by train.seed, the worker and the step. The same seed gives the same
// schedule in every run, however the steps are timed, and every worker its
// own.
#include <cstdint>

#include "shared/config.h"

namespace pstrain {

// The two numbers, each uniform in [0, 1), one step's delay is made of.
struct StragglerDraw {
  double jitter;  // where in [delay - jitter, delay + jitter] the step falls
  double pause;   // the step pauses when this is below the pause probability
};

// Whether train.straggler_* slows `worker` at all: it is named (or all are)
// and some delay or pause is configured.
bool straggles(const TrainConfig& train, std::uint32_t worker);

// The draw for `worker`'s step `step` under `seed`.
StragglerDraw straggler_draw(std::uint64_t seed, std::uint32_t worker, std::uint64_t step);

// A straggling worker's delay for a step with `draw`, in ms:
// straggler_delay_ms + straggler_jitter_ms * (2 * draw.jitter - 1), at least
// 0, plus straggler_pause_ms when draw.pause < straggler_pause_probability.
double straggler_delay_ms(const TrainConfig& train, StragglerDraw draw);

// How long `worker` sleeps after its step `step` (counted from 1), in ms: 0
// unless it straggles, else the delay of its draw under train.seed.
double straggler_delay_ms(const TrainConfig& train, std::uint32_t worker, std::uint64_t step);

}  // namespace pstrain
