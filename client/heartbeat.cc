#include "client/heartbeat.h"

#include <algorithm>
#include <chrono>

#include "shared/log.h"

namespace pstrain {

HeartbeatThread::HeartbeatThread(const ClusterConfig& config, std::uint32_t worker)
    : ps_(config, worker, shard_map_for(config, {})),
      interval_s_(interval_s(config.net)),
      thread_([this] { loop(); }) {}

HeartbeatThread::~HeartbeatThread() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

double HeartbeatThread::interval_s(const NetConfig& net) {
  return std::min(net.heartbeat, net.worker_timeout / 4);
}

void HeartbeatThread::loop() {
  using Clock = std::chrono::steady_clock;
  const auto interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s_));
  bool failing = false;
  while (true) {
    try {
      ps_.heartbeat(0);
      if (failing) log("liveness heartbeats reach every ps again");
      failing = false;
    } catch (const PsError& e) {
      if (!failing) log("liveness heartbeat failed (", e.what(), "); retrying every ",
                        interval_s_, " s");
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
