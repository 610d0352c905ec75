#pragma once
// What each identity may ask of a ps when its key is authenticated
// (security.curve; docs/security.md has the table). The identity comes from
// the connection's CURVE key (server/zap_handler.h), never from the message:
// a header whose sender differs from the key's is refused whatever its op.
//
//   hello, stats                         anyone listed
//   pull, push, push_pull, init,         workers, each only as itself
//   sparse_pull, sparse_push,
//   sparse_push_pull,
//   barrier, heartbeat, progress, done,
//   kv_get
//   kv_set                               workers, only keys of their own
//                                        namespace (wire::kv_key)
//   assign                               worker 0 in sync and local mode (it writes the
//                                        replicas' weights back)
//   snapshot                             the tool, and worker 0 (it saves the
//                                        servers' state at the end of a run)
//   shutdown                             the tool
//   init, push, push_pull, assign, step  forwarded (replication.replicas 2): the
//                                        ps whose shard's copy this ps keeps
//                                        (server/replicator.h), for any sender
//
// Without CURVE nobody is authenticated and none of this is checked.
#include <cstdint>
#include <optional>
#include <string>

#include "shared/curve_keys.h"
#include "shared/protocol.h"

namespace pstrain::ps {

struct RightsPolicy {
  std::uint32_t workers = 0;  // worker indices are 0 .. workers-1; senders past them are tools
  bool sync = false;          // mode: sync or local (worker 0 assigns)
  // replication.replicas 2: the ps whose forwards this ps serves.
  std::optional<std::uint32_t> replica_of;
};

// nullopt when `who` may send `request` (`forward`: as a primary's forward
// of its worker's update, server/replicator.h); else why not, e.g. "shutdown
// needs the tool's key; this key is worker:1".
std::optional<std::string> refusal(const Identity& who, const wire::Header& request,
                                   const RightsPolicy& policy, bool forward = false);

}  // namespace pstrain::ps
