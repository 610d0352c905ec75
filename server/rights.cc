#include "server/rights.h"

#include "shared/messages.h"

namespace pstrain::ps {

using wire::Op;
using Role = Identity::Role;

std::optional<std::string> refusal(const Identity& who, const wire::Header& request,
                                   const RightsPolicy& policy, bool forward) {
  const std::string op(wire::to_string(request.op));
  const std::string key = "; this key is " + who.name();
  if (forward) {
    if (who.role != Role::ps || who.index != policy.replica_of)
      return "forwarded " + op + " needs the key of the ps whose shard's copy this is" + key;
    // Updates, mode backup's steps, and the primary's pings (its lease,
    // server/replicator.h).
    if (request.op == Op::init || request.op == Op::heartbeat || request.op == Op::step ||
        wire::is_update(request.op))
      return std::nullopt;
    return op + " is not forwarded between ps" + key;
  }
  const bool worker = who.role == Role::worker;
  // The sender index a worker's messages carry is its key's; anyone else
  // must not claim a worker's index.
  if (worker ? request.sender != who.index : request.sender < policy.workers)
    return op + " claims sender " + std::to_string(request.sender) + key;
  switch (request.op) {
    case Op::hello:
    case Op::stats:
      return std::nullopt;
    case Op::pull:
    case Op::sparse_pull:
    case Op::sparse_push:
    case Op::sparse_push_pull:
    case Op::push:
    case Op::push_pull:
    case Op::init:
    case Op::barrier:
    case Op::heartbeat:
    case Op::progress:
    case Op::done:
    case Op::kv_get:
      if (worker) return std::nullopt;
      return op + " needs a worker's key" + key;
    case Op::kv_set: {
      if (!worker) return op + " needs a worker's key" + key;
      const auto writer = wire::kv_writer(wire::KvSet::read(request).key);
      if (writer == who.index) return std::nullopt;
      return op + " of '" + wire::KvSet::read(request).key +
             "' writes outside the key's namespace '" + wire::kv_key(who.index, "") + "'" + key;
    }
    case Op::assign:
      if (worker && who.index == 0 && policy.sync) return std::nullopt;
      return op + " needs worker 0's key in sync mode" + key;
    case Op::snapshot:
      if (who.role == Role::tool || (worker && who.index == 0)) return std::nullopt;
      return op + " needs the tool's or worker 0's key" + key;
    case Op::shutdown:
      if (who.role == Role::tool) return std::nullopt;
      return op + " needs the tool's key" + key;
    case Op::step:
      return op + " is sent only by a primary to its backup" + key;
  }
  return op + " is not an operation any key may send";
}

}  // namespace pstrain::ps
