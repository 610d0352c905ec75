#pragma once
// The communicator a sync-mode worker uses, picked by where its backend's
// memory lives:
//
//   const SyncAttempt attempt = join_sync_run(ps, config, index);
//   auto comm = make_communicator(config, index, backend, ps, attempt.prefix);
//   comm->allreduce_sum(grad, n);   // every worker, same order, same sizes
//
// Both kinds meet their peers through ps 0 (client/comm/rendezvous.h), so a
// worker needs nothing beyond cluster.yaml to join.
#include <cstdint>
#include <memory>
#include <string>

#include "client/comm/communicator.h"
#include "client/compute/backend.h"
#include "shared/config.h"

namespace pstrain {

class KvStore;

// Gloo for CPU backends; NCCL through the CUDA library for backends the host
// cannot reach, with the NCCL id made by worker 0 and handed out through ps
// 0's key-value store, under the attempt's key prefix `prefix`
// (SyncAttempt::prefix: every worker joined the attempt before). `store` is used
// during the call and, for Gloo, again for
// the roll call after a failure, so the caller must not use it from another
// thread while a communicator call runs.
std::unique_ptr<Communicator> make_communicator(const ClusterConfig& config, std::uint32_t index,
                                                Backend& backend, KvStore& store,
                                                const std::string& prefix);

}  // namespace pstrain
