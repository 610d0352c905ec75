#pragma once
// The ps's answers about one chunk, which the chunk ops
// (server/chunk_handlers.h) and the consistency policies
// (server/consistency/policy.h) send: its version, or its values in the
// request's dtype (f32 as the chunk's own buffer, without a copy; bf16 or
// fp16 as a rounded copy, net.wire_dtype).
#include "server/chunk_store.h"
#include "server/request.h"

namespace pstrain::ps {

// `values` as a reply to `request` carries them, in its dtype: f32 as the
// buffer itself, bf16 and fp16 as a rounded copy.
ReplyPayload values_for(const Request& request, const ValueBuffer& values);

void reply_version(ReplySink& sink, const Request& request, const Chunk& chunk);
void reply_values(ReplySink& sink, const Request& request, const Chunk& chunk);
// A push's answer is the version, a push_pull's the values.
void reply_update(ReplySink& sink, const Request& request, const Chunk& chunk);

}  // namespace pstrain::ps
