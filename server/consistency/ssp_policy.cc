#include "server/consistency/ssp_policy.h"

#include <algorithm>

#include "server/chunk_replies.h"
#include "shared/log.h"

namespace pstrain::ps {

void SspPolicy::on_pull(const Request& request, const wire::ChunkRequest& id, const Chunk& c) {
  if (gate_.retarget(request)) return;
  // A push_pull's reply is the read of the pusher's next step.
  const auto clock = request.header.op == wire::Op::push_pull ? id.clock + 1 : id.clock;
  if (!gate_.may_read(clock, slowest())) return park(request, clock);
  reply_values(context_.sink, request, c);
}

void SspPolicy::on_push(const Request& request, const wire::ChunkRequest& id,
                        std::span<const float> grad) {
  const Chunk& c = apply_gradient(context_, request, id, grad);
  gate_.completed(request.header.sender, id.clock + 1);
  // One look at the clocks serves all three: the pusher's own completion
  // can raise the slowest only where its staleness is 0 either way.
  const auto slow = slowest();
  const auto staleness = SspGate::staleness(id.clock, slow);
  context_.stats.ssp_staleness(staleness);
  largest_staleness_ = std::max(largest_staleness_, staleness);
  release_reads(slow);
  if (request.header.op == wire::Op::push_pull && !gate_.may_read(id.clock + 1, slow)) {
    context_.sink.accepted(request.header, c.version);
    return park(request, id.clock + 1);
  }
  reply_update(context_.sink, request, c);
}

void SspPolicy::adopt_worker_clocks(std::span<const std::uint64_t> clocks) {
  gate_.adopt_clocks(clocks);
  release_reads(slowest());
}

void SspPolicy::park(const Request& read, std::uint64_t clock) {
  gate_.park(read, clock, context_.store.size());
  context_.stats.held(gate_.parked(), 0);
}

std::uint64_t SspPolicy::slowest() const {
  return gate_.slowest([this](std::uint32_t w) { return !liveness_.absent(w); });
}

void SspPolicy::release_reads(std::uint64_t slowest) {
  const auto released = gate_.release(slowest);
  for (const auto& read : released)
    reply_values(context_.sink, read,
                 existing_chunk(context_.store, wire::ChunkRequest::read(read.header)));
  if (!released.empty()) context_.stats.held(gate_.parked(), 0);
}

void SspPolicy::log_summary() const {
  log("mode ssp: the largest staleness of an applied update was ", largest_staleness_,
      " steps (train.staleness_bound ", gate_.bound(), ")");
}

}  // namespace pstrain::ps
