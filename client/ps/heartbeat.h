#pragma once
// A worker's liveness heartbeats, sent from a thread of their own so that
// nothing the worker does between them (loading data, a slow GPU start, a
// long step, waiting for slower workers, the final evaluation and snapshot)
// makes the servers count it lost after net.worker_timeout (see
// server/coordinator.h, "Liveness").
//
// These heartbeats carry no samples: the training loop's progress reports
// (client/train/step_metrics.h) and done still bring the worker's
// sample count to the servers, as before.
//
// The thread owns its own PsClient (a PsClient is used by one thread) under
// the worker's index, so every ps hears the worker through it. A heartbeat
// that fails (a ps not up yet, restarting, or stalled) is logged once per run
// of failures and tried again at the next interval: the training thread
// learns of a dead ps from its own requests. Its replies are awaited for at
// most half a worker_timeout, so one stalled ps does not starve the others of
// this worker's heartbeats.
//
// Thread rules: construct and destroy on one thread. The destructor stops the
// thread and waits for a heartbeat in flight (at most net.request_timeout);
// destroy it before the worker's done, after which a ps may exit.
#include <condition_variable>
#include <cstdint>
#include <thread>

#include "client/ps/ps_client.h"
#include "shared/config.h"
#include "shared/thread_annotations.h"

namespace pstrain {

class HeartbeatThread {
 public:
  // Starts heartbeating every ps of `config` as worker `worker` right away,
  // every liveness_interval(config.net) (shared/config.h): net.heartbeat,
  // but at most a quarter of worker_timeout, so a heartbeat or two may be
  // late or lost before the servers give up.
  HeartbeatThread(const ClusterConfig& config, std::uint32_t worker);
  ~HeartbeatThread();
  HeartbeatThread(const HeartbeatThread&) = delete;
  HeartbeatThread& operator=(const HeartbeatThread&) = delete;

 private:
  void loop();

  PsClient ps_;  // the thread's alone
  const double interval_s_;
  Mutex mutex_;
  std::condition_variable_any wake_;
  bool stop_ GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: started once everything above is ready
};

}  // namespace pstrain
