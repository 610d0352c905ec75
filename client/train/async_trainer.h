#pragma once
// The asynchronous training loop of one worker: pull, forward and backward on
// one batch (or train.accumulate_steps micro-batches, their gradients
// averaged: client/train/train_loop.h, GradAccumulator), push, never waiting for
// other workers. A step is one push of every variable; the ps's clocks (ssp)
// and a restart's resume point count them.
//
// Each variable's gradient goes out as a push_pull the moment backward has
// produced it, so the ps applies it (and the reply brings the new weights)
// while backward still runs on earlier layers; the next step starts once
// every reply has landed. On backends whose memory the host cannot reach
// (CUDA), gradients are downloaded into pinned buffers and pushed as each
// download's fence completes, and the pulled weights are uploaded before the
// next forward.
//
// train.precision fp16 (where the backend computes it) scales the loss
// (client/train/loss_scaler.h): the step's gradients are pushed after backward,
// once all are known to be finite, and a step with an overflow pushes
// nothing (the ps sees a late step: ssp's clock moves on, backup waits for
// others).
//
// A ps that restarts (client/ps/ps_restarts.h) is met before the next step: the
// worker says hello again and re-pulls every variable, or stops with an
// error naming a ps that restarted without its checkpoint.
#include "client/train/train_loop.h"

namespace pstrain {

// `first_step`: the optimizer step where a restarted worker resumes
// (steps_for_samples, in whole accumulation groups).
TrainSummary train_async(const TrainContext& context, std::uint64_t first_step = 0);

}  // namespace pstrain
