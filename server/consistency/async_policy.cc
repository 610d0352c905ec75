#include "server/consistency/async_policy.h"

#include "server/chunk_replies.h"

namespace pstrain::ps {

void AsyncPolicy::on_pull(const Request& request, const wire::ChunkRequest&, const Chunk& c) {
  reply_values(context_.sink, request, c);
}

void AsyncPolicy::on_push(const Request& request, const wire::ChunkRequest& id,
                          std::span<const float> grad) {
  reply_update(context_.sink, request, apply_gradient(context_, request, id, grad));
}

}  // namespace pstrain::ps
