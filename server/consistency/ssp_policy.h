#pragma once
// Mode ssp: gradients applied as in async; a read (a pull, or the reply to
// a push_pull, which is the read of the pusher's next step) of a worker too
// far ahead of the slowest is held by the gate (ssp_gate.h) and answered
// when the slowest catches up, or when the workers holding it back are lost.
#include <cstdint>

#include "server/consistency/policy.h"
#include "server/consistency/ssp_gate.h"

namespace pstrain::ps {

class SspPolicy final : public ConsistencyPolicy {
 public:
  // `liveness` says which workers are lost.
  SspPolicy(const PolicyContext& context, std::uint32_t workers, std::uint64_t bound,
            const Coordinator& liveness)
      : context_(context), liveness_(liveness), gate_(workers, bound) {}
  void on_pull(const Request& request, const wire::ChunkRequest& id, const Chunk& c) override;
  void on_push(const Request& request, const wire::ChunkRequest& id,
               std::span<const float> grad) override;
  void on_tick() override { release_reads(slowest()); }
  std::vector<std::uint64_t> worker_clocks() const override { return gate_.clocks(); }
  void adopt_worker_clocks(std::span<const std::uint64_t> clocks) override;
  // The largest staleness of an applied update against the bound.
  void log_summary() const override;

 private:
  // The fewest steps a worker not lost completed, and the reads it lets go.
  std::uint64_t slowest() const;
  void release_reads(std::uint64_t slowest);
  void park(const Request& read, std::uint64_t clock);

  PolicyContext context_;
  const Coordinator& liveness_;
  SspGate gate_;
  std::uint64_t largest_staleness_ = 0;
};

}  // namespace pstrain::ps
