#include "server/sparse_handlers.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/chunk_replies.h"
#include "shared/messages.h"
#include "shared/metrics.h"

namespace pstrain::ps {
namespace {

using wire::Op;

// A request's ids (frame 0), copied: a frame may sit at any address.
std::vector<std::uint64_t> ids_of(const Request& request) {
  std::vector<std::uint64_t> ids(request.payload.size() / sizeof(std::uint64_t));
  if (!ids.empty()) std::memcpy(ids.data(), request.payload.data(), request.payload.size());
  return ids;
}

// The table the request names, whose row width it must carry.
const TableSpec& table_of(const TableStore& tables, const wire::SparseRequest& request) {
  const TableSpec& spec = tables.spec(request.table);
  if (request.dim != spec.dim)
    throw std::invalid_argument("table '" + spec.name + "' has rows of " +
                                std::to_string(spec.dim) + ", the request " +
                                std::to_string(request.dim));
  return spec;
}

}  // namespace

SparseHandlers::SparseHandlers(TableStore& tables, Coordinator& coordinator, ReplySink& sink,
                               PsStats& stats)
    : tables_(tables), coordinator_(coordinator), sink_(sink), stats_(stats), nonfinite_(stats) {}

void SparseHandlers::add_handlers(Handlers& handlers) {
  handlers.on(Op::sparse_pull, [this](const Request& r) { pull(r); });
  handlers.on(Op::sparse_push, [this](const Request& r) { push(r); });
  handlers.on(Op::sparse_push_pull, [this](const Request& r) { push(r); });
}

void SparseHandlers::pull(const Request& request) {
  const auto sparse = wire::SparseRequest::read(request.header);
  const TableSpec& spec = table_of(tables_, sparse);
  if (request.header.payload_frames != 1)
    throw wire::ProtocolError("sparse_pull carries its ids alone, in one payload frame");
  if (!wire::is_float(request.header.dtype))
    throw wire::ProtocolError("rows travel as f32, bf16 or fp16, not " +
                              std::string(wire::to_string(request.header.dtype)));
  const auto ids = ids_of(request);
  stats_.sparse_ids(ids.size());
  auto rows = std::make_shared<std::vector<float>>(ids.size() * spec.dim);
  tables_.read(sparse.table, ids, *rows);
  Reply reply{wire::reply_to(request.header), values_for(request, rows)};
  wire::SparseReply{0}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void SparseHandlers::push(const Request& request) {
  const auto sparse = wire::SparseRequest::read(request.header);
  const TableSpec& spec = table_of(tables_, sparse);
  if (request.header.payload_frames != 2)
    throw wire::ProtocolError(std::string(wire::to_string(request.header.op)) +
                              " carries its ids and their gradients, in two payload frames");
  const auto ids = ids_of(request);
  stats_.sparse_ids(ids.size());
  const FloatPayload grads(request, request.rows, true);
  // Everything is checked before anything changes: the values here, the
  // ids by the store (update() checks them before it touches a row).
  nonfinite_.check(request, grads.get());
  const auto created =
      tables_.update(sparse.table, ids, grads.get(), static_cast<std::uint32_t>(unix_time()));
  coordinator_.applied_update(request.header);
  Reply reply{wire::reply_to(request.header), {}};
  if (request.header.op == Op::sparse_push_pull) {
    auto rows = std::make_shared<std::vector<float>>(ids.size() * spec.dim);
    tables_.read(sparse.table, ids, *rows);
    reply.payload = values_for(request, rows);
  }
  wire::SparseReply{created}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

}  // namespace pstrain::ps
