#include "shared/fault.h"

#include <chrono>
#include <thread>

namespace pstrain {

FaultInjector::FaultInjector(FaultConfig config, std::uint64_t seed)
    : config_(config), random_(seed), dropped_(config.drop) {}

bool FaultInjector::drop(wire::Op op) {
  using wire::Op;
  const bool data =
      op == Op::init || op == Op::pull || op == Op::push || op == Op::push_pull || op == Op::assign;
  if (!data || (config_.drop == 0 && config_.delay_ms == 0)) return false;
  if (dropped_(random_)) return true;
  if (config_.delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.delay_ms));
  return false;
}

}  // namespace pstrain
