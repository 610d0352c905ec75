#pragma once
// How a ps answers pushes and pulls: one policy per consistency mode
// (shared/modes.h's ServerPolicy, docs/modes.md):
//   - async (async_policy.h): every gradient applied as it arrives, every
//     read answered at once;
//   - ssp (ssp_policy.h): as async, but a read of a worker too far ahead of
//     the slowest is held until the slowest catches up (ssp_gate.h);
//   - backup (backup_policy.h): each step of a chunk applies the mean of its
//     first gradients and drops the late ones (backup_aggregator.h).
// The chunk ops (server/chunk_handlers.h) decode and check a request and
// hand it to the policy, which answers it now or holds it; on_tick() lets go
// of what the coordinator's news (a worker lost or finished) releases. A
// resend of a held request is answered by the held reply. A new mode is one
// more policy here and a row in shared/modes.h.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>

#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/ps_stats.h"
#include "server/request.h"
#include "shared/config.h"
#include "shared/messages.h"

namespace pstrain::ps {

// The mode and what its policy needs of the config (ClusterConfig::mode and
// its train.* keys).
struct Consistency {
  Mode mode = Mode::async;
  std::uint32_t workers = 0;
  std::uint64_t staleness_bound = 0;  // ssp
  std::uint32_t backup_workers = 0;   // backup
  // backup: a step's mean applied with the learning rate times the
  // gradients it averages (train.lr_scaling: the linear scaling rule),
  // times the micro-batches each of them averages (train.accumulate_steps).
  bool lr_scaling = false;
  std::uint32_t accumulate_steps = 1;
  // Who is lost (ssp's gate counts the others), when not the coordinator
  // that counts the updates: a shard's copy counts its own, but only its
  // ps's own coordinator hears the workers' heartbeats. None: that one.
  const Coordinator* liveness = nullptr;
  // Mode backup on a shard's copy: while this says so (until the copy is
  // taken over), the copy applies the steps its primary applied (on_step),
  // acknowledging each forwarded gradient as it comes, rather than collect
  // steps of its own, which could take other gradients (its ps may count
  // other workers as training). Empty: this ps decides its steps.
  std::function<bool()> follows = {};
};

// A shard's copy refuses its primary's step because it is not at the
// step's version: it misses updates, and must never be taken over with them
// (server/dispatcher.h marks it given up).
struct CopyMissesUpdates : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The ps's parts a policy works with.
struct PolicyContext {
  ChunkStore& store;
  Coordinator& coordinator;  // counts applied updates; says who is lost
  ReplySink& sink;
  PsStats& stats;
};

class ConsistencyPolicy {
 public:
  virtual ~ConsistencyPolicy() = default;
  // A pull of chunk `c` (also the pull half of a resent push_pull).
  virtual void on_pull(const Request& request, const wire::ChunkRequest& id, const Chunk& c) = 0;
  // A push or push_pull of `grad` (finite values; the chunk may not exist
  // or have another size, which the policy refuses with
  // std::invalid_argument before it changes anything).
  virtual void on_push(const Request& request, const wire::ChunkRequest& id,
                       std::span<const float> grad) = 0;
  // A primary's step of a chunk (wire::Op::step, mode backup on a shard's
  // copy): `mean` applied as the primary applied it. Throws
  // std::invalid_argument elsewhere, CopyMissesUpdates when the chunk is not
  // at the version the step was applied at.
  virtual void on_step(const Request& request, const wire::StepRequest& step,
                       std::span<const float> mean);
  // Between requests.
  virtual void on_tick() {}
  // For the end of the ps's log: what the mode did.
  virtual void log_summary() const {}
  // The per-worker state the mode keeps beside the chunks (ssp: the steps
  // each worker completed), which a shard's state carries to the ps that
  // serves the shard next (re-join, server/shard_state.h); none in the
  // other modes.
  virtual std::vector<std::uint64_t> worker_clocks() const { return {}; }
  virtual void adopt_worker_clocks(std::span<const std::uint64_t> /*clocks*/) {}
};

std::unique_ptr<ConsistencyPolicy> make_policy(const Consistency& consistency,
                                               const PolicyContext& context);

// Chunk `id`; throws std::invalid_argument when this ps has none.
const Chunk& existing_chunk(const ChunkStore& store, const wire::ChunkRequest& id);

// What async and ssp do with a gradient: applied with the optimizer at once,
// its staleness counted, the update acknowledged to the coordinator.
const Chunk& apply_gradient(const PolicyContext& context, const Request& request,
                            const wire::ChunkRequest& id, std::span<const float> grad);

}  // namespace pstrain::ps
