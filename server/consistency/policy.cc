#include "server/consistency/policy.h"

#include <algorithm>
#include <stdexcept>

#include "server/consistency/async_policy.h"
#include "server/consistency/backup_policy.h"
#include "server/consistency/ssp_policy.h"
#include "shared/modes.h"

namespace pstrain::ps {

std::unique_ptr<ConsistencyPolicy> make_policy(const Consistency& consistency,
                                               const PolicyContext& context) {
  switch (traits(consistency.mode).server) {
    case ServerPolicy::ssp:
      return std::make_unique<SspPolicy>(context, consistency.workers, consistency.staleness_bound);
    case ServerPolicy::backup:
      return std::make_unique<BackupPolicy>(context, consistency);
    case ServerPolicy::async:
      break;
  }
  return std::make_unique<AsyncPolicy>(context);
}

const Chunk& existing_chunk(const ChunkStore& store, const wire::ChunkRequest& id) {
  const Chunk* c = store.find(id.variable, id.chunk);
  if (!c) throw std::invalid_argument("unknown chunk (not initialized on this ps)");
  return *c;
}

const Chunk& apply_gradient(const PolicyContext& context, const Request& request,
                            const wire::ChunkRequest& id, std::span<const float> grad) {
  const Chunk& c = context.store.push(id.variable, id.chunk, grad);
  // The request's version is the one its sender last pulled (ChunkRequest).
  const auto before = c.version - 1;
  context.stats.pushed(before - std::min(before, request.header.version),
                       context.store.stats().last_optimizer_seconds);
  context.coordinator.applied_update(request.header);
  return c;
}

}  // namespace pstrain::ps
