#include "shared/fault.h"

#include <chrono>
#include <thread>

namespace pstrain {

FaultInjector::FaultInjector(FaultConfig config, std::uint64_t seed)
    : config_(config), random_(seed), dropped_(config.drop) {}

bool FaultInjector::drop(wire::Op op) {
  // A primary's steps (mode backup) are resent like data requests.
  const bool resent = wire::is_data_op(op) || op == wire::Op::step;
  if (!resent || (config_.drop == 0 && config_.delay_ms == 0)) return false;
  if (dropped_(random_)) return true;
  if (config_.delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.delay_ms));
  return false;
}

}  // namespace pstrain
