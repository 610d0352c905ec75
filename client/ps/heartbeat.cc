#include "client/ps/heartbeat.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "shared/log.h"

namespace pstrain {
namespace {

PsClientOptions heartbeat_options(const ClusterConfig& config, std::uint32_t worker) {
  PsClientOptions options = client_options(config, worker);
  // A ps that does not answer must not hold up the heartbeats of the others
  // for a whole request_timeout: past half a worker_timeout they would give
  // this worker up. (A ps counts a heartbeat when it arrives, so a slow
  // answer costs nothing but a logged failure.)
  options.timeout_s = std::min(config.net.request_timeout, config.net.worker_timeout / 2);
  // With replicated shards a ps silent for backup_silence has its shard
  // taken over and is likely gone: the worker's last heartbeat, which its
  // exit waits for, must not wait on it longer than that.
  if (config.replication.replicas > 1)
    options.timeout_s = std::min(options.timeout_s, config.replication.backup_silence);
  return options;
}

}  // namespace

HeartbeatThread::HeartbeatThread(const ClusterConfig& config, std::uint32_t worker)
    : ps_(ps_addresses(config), shard_map_for(config, {}), config.run_id(),
          heartbeat_options(config, worker)),
      interval_s_(liveness_interval(config.net)),
      thread_([this] { loop(); }) {}

HeartbeatThread::~HeartbeatThread() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void HeartbeatThread::loop() {
  using Clock = std::chrono::steady_clock;
  const auto interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s_));
  bool failing = false;
  while (true) {
    try {
      ps_.heartbeat();
      if (failing) log("liveness heartbeats reach every ps again");
      failing = false;
    } catch (const PsError& e) {
      if (!failing)
        log("liveness heartbeat failed (", e.what(), "); retrying every ", interval_s_, " s");
      failing = true;
    }
    MutexLock lock(mutex_);
    const auto next = Clock::now() + interval;
    while (!stop_ && wake_.wait_until(mutex_, next) == std::cv_status::no_timeout) {
    }
    if (stop_) return;
  }
}

}  // namespace pstrain
