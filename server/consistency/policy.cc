#include "server/consistency/policy.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "server/consistency/async_policy.h"
#include "server/consistency/backup_policy.h"
#include "server/consistency/ssp_policy.h"
#include "shared/modes.h"

namespace pstrain::ps {

std::unique_ptr<ConsistencyPolicy> make_policy(const Consistency& consistency,
                                               const PolicyContext& context) {
  switch (traits(consistency.mode).server) {
    case ServerPolicy::ssp:
      return std::make_unique<SspPolicy>(
          context, consistency.workers, consistency.staleness_bound,
          consistency.liveness ? *consistency.liveness : context.coordinator);
    case ServerPolicy::backup:
      return std::make_unique<BackupPolicy>(context, consistency);
    case ServerPolicy::async:
      break;
  }
  return std::make_unique<AsyncPolicy>(context);
}

void ConsistencyPolicy::on_step(const Request&, const wire::StepRequest&, std::span<const float>) {
  throw std::invalid_argument("a step is applied only to a shard's copy in mode backup");
}

const Chunk& existing_chunk(const ChunkStore& store, const wire::ChunkRequest& id) {
  const Chunk* c = store.find(id.variable, id.chunk);
  if (!c) throw std::invalid_argument("unknown chunk (not initialized on this ps)");
  return *c;
}

const Chunk& apply_gradient(const PolicyContext& context, const Request& request,
                            const wire::ChunkRequest& id, std::span<const float> grad) {
  // The request's version is the one its sender computed the gradient on
  // (ChunkRequest): the updates since are its staleness.
  const auto staleness = [&](std::uint64_t now) {
    return now - std::min(now, request.header.version);
  };
  float lr_scale = 1;
  // Reused: a chunk's worth per push otherwise (one ps thread serves pushes).
  thread_local std::vector<float> scaled;
  const auto& optimizer = context.store.optimizer();
  if (optimizer.staleness_lr) {
    const float scale = 1.0f / static_cast<float>(std::max<std::uint64_t>(
                                   1, staleness(existing_chunk(context.store, id).version)));
    // Momentum: the gradient's own step is scaled, not the velocity's
    // memory of the fresher ones before it (which a scaled learning rate
    // would shrink too). Elsewhere the learning rate: the same for SGD, and
    // what counts for Adam's and Adagrad's normalized steps.
    // (Weight decay, part of the objective rather than of the stale
    // gradient, stays whole.)
    if (optimizer.kind == OptimizerKind::momentum && scale != 1.0f) {
      scaled.assign(grad.begin(), grad.end());
      for (float& g : scaled) g *= scale;
      grad = scaled;
    } else {
      lr_scale = scale;
    }
  }
  const Chunk& c = context.store.push(id.variable, id.chunk, grad, lr_scale);
  const auto before = c.version - 1;
  context.stats.pushed(staleness(before), context.store.stats().last_optimizer_seconds);
  context.coordinator.applied_update(request.header);
  return c;
}

}  // namespace pstrain::ps
