#pragma once
// How sync-mode workers find each other: through ps 0's key-value store
// (PsClient::kv_set / kv_get), so no extra process or shared file system is
// needed. It agrees on the run's attempt, hands out NCCL's id, and serves as
// Gloo's rendezvous store.
//
// Every key is prefixed with the run's namespace from join_sync_run():
// "sync/<config hash>/<attempt>/". A ps outlives a crashed set of workers
// (until net.worker_timeout), so a restarted run must not read the
// addresses the previous attempt left behind.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "client/cuda_loader.h"
#include "shared/config.h"

namespace pstrain {

class PsClient;

// Agrees on a fresh attempt among the run's workers and returns the key
// prefix for it. Worker 0 draws a random attempt id and publishes it before
// it enters the barrier "sync/<hash>/join"; the others read it once the
// barrier has let everyone through, so nobody can read an earlier attempt's
// id. The wait has no limit of its own (workers may start minutes apart): a
// worker that never comes makes ps 0 exit after net.worker_timeout, which
// ends the wait in a CommError naming the barrier.
std::string join_sync_run(PsClient& ps, const ClusterConfig& config, std::uint32_t index);

// NCCL's rendezvous id for the attempt `prefix` (from join_sync_run): worker
// 0 makes it (cuda::nccl_unique_id, no GPU needed) and publishes it, the
// others wait up to `timeout_s` for it. Throws CommError when it does not
// come or has the wrong size.
cuda::NcclId share_nccl_id(PsClient& ps, const std::string& prefix, std::uint32_t index,
                           double timeout_s);

class RendezvousStore : public gloo::rendezvous::Store {
 public:
  // `ps` must not be used by another thread while a store call runs.
  RendezvousStore(PsClient& ps, std::string prefix, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the store's timeout for the key; throws PsError after it.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  PsClient& ps_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace pstrain
