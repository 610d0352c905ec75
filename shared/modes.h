#pragma once
// What each mode implies (shared/config.h's Mode; docs/modes.md), in one
// table that the config (train.on_worker_loss's default), the ps (its
// consistency policy, server/consistency/), the worker (its trainer) and,
// through `pstrain --check`'s resolved config, the launcher read, so that
// no two places decide it apart.
//
//   mode     ps answers   worker steps   a lost worker   all-reduce
//   async    async        through_ps     continue        no
//   ssp      ssp          through_ps     continue        no
//   backup   backup       through_ps     continue        no
//   sync     async        allreduce      fail            yes
//   local    async        local_sgd      fail            yes
//
// The ps of an all-reduce mode answers as in async: it only receives worker
// 0's assigns. Every step of an all-reduce needs every worker, so a lost one
// ends the run; through the ps the others go on (ssp and backup count only
// the live ones).
#include "shared/config.h"

namespace pstrain {

// How a ps answers pushes and pulls.
enum class ServerPolicy { async, ssp, backup };
// How a worker takes its steps: pushing gradients to the ps, all-reducing
// them with its peers every step, or stepping alone and averaging weights
// every train.local_steps steps.
enum class WorkerStrategy { through_ps, allreduce, local_sgd };

struct ModeTraits {
  Mode mode;
  ServerPolicy server;
  WorkerStrategy worker;
  WorkerLoss on_worker_loss;  // train.on_worker_loss's default
  // The workers all-reduce (Gloo or NCCL) and the ps holds the copy worker 0
  // assigns: true exactly for the all-reduce strategies.
  bool allreduce() const { return worker != WorkerStrategy::through_ps; }
};

const ModeTraits& traits(Mode mode);

}  // namespace pstrain
