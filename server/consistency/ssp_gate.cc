#include "server/consistency/ssp_gate.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace pstrain::ps {

SspGate::SspGate(std::uint32_t workers, std::uint64_t bound)
    : bound_(bound), completed_(workers, 0) {}

void SspGate::completed(std::uint32_t worker, std::uint64_t steps) {
  if (worker >= completed_.size()) return;
  completed_[worker] = std::max(completed_[worker], steps);
}

void SspGate::adopt_clocks(std::span<const std::uint64_t> clocks) {
  for (std::size_t w = 0; w < std::min(clocks.size(), completed_.size()); ++w)
    completed_[w] = std::max(completed_[w], clocks[w]);
}

std::uint64_t SspGate::slowest(const std::function<bool(std::uint32_t)>& counted) const {
  std::uint64_t least = std::numeric_limits<std::uint64_t>::max();
  for (std::uint32_t w = 0; w < completed_.size(); ++w)
    if (counted(w)) least = std::min(least, completed_[w]);
  return least;
}

bool SspGate::may_read(std::uint64_t clock, std::uint64_t slowest) const {
  return clock <= bound_ || clock - bound_ <= slowest;
}

std::uint64_t SspGate::staleness(std::uint64_t step, std::uint64_t slowest) {
  return step > slowest ? step - slowest : 0;
}

void SspGate::park(const Request& read, std::uint64_t clock, std::size_t limit) {
  auto& held = parked_by_sender_[read.header.sender];
  if (held >= limit) {
    if (held == 0) parked_by_sender_.erase(read.header.sender);
    throw std::invalid_argument("sender " + std::to_string(read.header.sender) + " has " +
                                std::to_string(held) +
                                " reads held already, one per chunk of this ps at most");
  }
  ++held;
  Request kept = read;
  kept.payload = {};
  parked_.emplace(clock <= bound_ ? 0 : clock - bound_, std::move(kept));
}

bool SspGate::retarget(const Request& resend) {
  for (auto& [_, held] : parked_) {
    if (!repeats(resend, held)) continue;
    held.from = resend.from;
    return true;
  }
  return false;
}

std::vector<Request> SspGate::release(std::uint64_t slowest) {
  std::vector<Request> out;
  const auto end = parked_.upper_bound(slowest);
  for (auto it = parked_.begin(); it != end; it = parked_.erase(it)) {
    if (--parked_by_sender_[it->second.header.sender] == 0)
      parked_by_sender_.erase(it->second.header.sender);
    out.push_back(std::move(it->second));
  }
  return out;
}

}  // namespace pstrain::ps
