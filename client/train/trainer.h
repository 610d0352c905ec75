#pragma once
// One worker's training, whatever the mode: one loop that owns what every
// mode shares (where a restarted worker resumes, the micro-batches of
// gradient accumulation, loading batches, the loss, the metrics lines and
// progress reports) and hands each step's gradients to the mode's step
// strategy (client/train/step_strategy.h), which brings back the next
// step's weights: through the ps, all-reduced between the workers, or local
// SGD's averages.
#include <cstdint>

#include "client/train/train_context.h"

namespace pstrain {

// Trains train.epochs of `context.shard`. `first_step`: the optimizer step
// where a restarted worker of a mode through the ps resumes
// (steps_for_samples, in whole accumulation groups); the all-reduce modes
// resume where their attempt says. Throws what ends the worker: a PsError,
// a CommError its strategy cannot recover from, a backend's error.
TrainSummary train(const TrainContext& context, std::uint64_t first_step = 0);

}  // namespace pstrain
