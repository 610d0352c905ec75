#pragma once
// Mode async (and the ps of the all-reduce modes, which only receives
// worker 0's assigns): every gradient applied as it arrives, every read
// answered at once with the chunk's current values.
#include "server/consistency/policy.h"

namespace pstrain::ps {

class AsyncPolicy final : public ConsistencyPolicy {
 public:
  explicit AsyncPolicy(const PolicyContext& context) : context_(context) {}
  void on_pull(const Request& request, const wire::ChunkRequest& id, const Chunk& c) override;
  void on_push(const Request& request, const wire::ChunkRequest& id,
               std::span<const float> grad) override;

 private:
  PolicyContext context_;
};

}  // namespace pstrain::ps
