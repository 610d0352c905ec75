#pragma once
// How sync-mode workers find each other: through a key-value store
// (client/ps/kv_store.h; ps 0's, PsControlClient), so no extra process or
// shared file system is needed. It agrees on the run's attempt, hands out NCCL's id, and serves as
// Gloo's rendezvous store.
//
// Every key is prefixed with the run's namespace, "sync/<run id>/" (ClusterConfig::run_id: a
// new one for every launch, so attempts of two launches never mix), and
// the attempt's: a failed attempt's keys (Gloo's addresses) are never read
// again, whether the workers restarted one by one (docs/sync.md, "Restarts")
// or the whole run restarted against a ps that is still up.
//
// Thread rules: each call uses the given store, which no other thread may
// use meanwhile.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "client/compute/cuda_loader.h"
#include "client/ps/kv_store.h"
#include "shared/config.h"

namespace pstrain {

// One attempt of a sync run: the workers that train together from one
// (re)start until the run ends or a peer fails.
struct SyncAttempt {
  std::uint64_t number = 0;  // 1, 2, ... counted by ps 0's kv store
  std::string prefix;        // "sync/<run id>/<number>/": this attempt's keys
  // Steps done by the weights ps 0 holds (0: the initial weights): every
  // worker pulls them and trains from step `step` + 1.
  std::uint64_t step = 0;
};

// Joins the next attempt of the run and returns it; every worker of the run
// gets the same one. Keys under "sync/<run id>/" on ps 0, each in its
// writer's namespace (wire::kv_key: worker 0's are "w0/sync/..."):
//
//   attempt           the newest attempt's number (worker 0 writes it)
//   step              the step of the weights on the ps (record_sync_step)
//   <n>/open          attempt n exists; its value is the step it resumes at
//                     (worker 0)
//   <n>/member/<i>    worker i has joined attempt n (worker i)
//
// Worker 0 opens attempt (newest + 1) at the recorded step, whether it is
// starting, restarted, or survived a failure. Another worker that survived
// the failure of attempt `failed` waits for attempt failed + 1. A worker that
// is starting (failed = 0), also restarted from scratch, joins the newest
// attempt if it is not a member of it yet (worker 0 opened it and waits for
// it), else the next one (the newest is the one its previous process
// joined). Each then waits until every worker is a member.
//
// Every wait ends at net.worker_timeout after the call (the ps gives up on a
// silent worker after as long): a CommError names the workers or the key
// waited for. While waiting it keeps the store's hosts aware it lives
// (KvStore::keep_alive) each net.heartbeat.
SyncAttempt join_sync_run(KvStore& store, const ClusterConfig& config, std::uint32_t index,
                          std::uint64_t failed = 0);

// Worker 0, once the weights of step `step` are on the ps (assign completed):
// records the step for the attempts to come.
void record_sync_step(KvStore& store, const ClusterConfig& config, std::uint64_t step);

// NCCL's rendezvous id for the attempt `prefix` (SyncAttempt::prefix): worker
// 0 makes it (cuda::nccl_unique_id, no GPU needed) and publishes it, the
// others wait up to `timeout_s` for it. Throws CommError when it does not
// come or has the wrong size.
cuda::NcclId share_nccl_id(KvStore& store, const std::string& prefix, std::uint32_t index,
                           double timeout_s);

class RendezvousStore : public gloo::rendezvous::Store {
 public:
  // `store` must not be used by another thread while a store call runs.
  RendezvousStore(KvStore& store, std::string prefix, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the store's timeout for the key; throws PsError after it.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  KvStore& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;

  // The worker whose namespace holds `key` (KvStore::kv_get): the rank the
  // key ends with. Throws CommError for a key that names none.
  static std::uint32_t writer(const std::string& key);
};

}  // namespace pstrain
