#include "server/chunk_replies.h"

#include <memory>
#include <vector>

#include "shared/low_precision.h"
#include "shared/messages.h"

namespace pstrain::ps {
ReplyPayload values_for(const Request& request, const ValueBuffer& values) {
  const auto half = wire::half_format(request.header.dtype);
  if (!half) return values;
  auto bits = std::make_shared<std::vector<std::uint16_t>>(values->size());
  encode_halves(*half, values->data(), bits->data(), values->size());
  return HalfValues{request.header.dtype, std::move(bits)};
}

void reply_version(ReplySink& sink, const Request& request, const Chunk& chunk) {
  Reply reply{wire::reply_to(request.header), {}};
  wire::ChunkReply{chunk.version}.write(reply.header);
  sink.send(request.from, std::move(reply));
}

void reply_values(ReplySink& sink, const Request& request, const Chunk& chunk) {
  Reply reply{wire::reply_to(request.header), values_for(request, chunk.values)};
  wire::ChunkReply{chunk.version}.write(reply.header);
  sink.send(request.from, std::move(reply));
}

void reply_update(ReplySink& sink, const Request& request, const Chunk& chunk) {
  if (request.header.op == wire::Op::push_pull) return reply_values(sink, request, chunk);
  reply_version(sink, request, chunk);
}

}  // namespace pstrain::ps
