#include "client/compute/cuda/stream_order.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace pstrain::cuda {
namespace {

constexpr std::size_t kMaxMarks = 32;

// How long wait() spins on a fence before it sleeps or blocks: a step's last
// kernels usually end within tens of microseconds, and waking from a sleep
// costs about as much again.
constexpr std::chrono::microseconds kSpin{50};
constexpr std::chrono::microseconds kSleep{20};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Polls `done` for up to kSpin; true once it answers true.
template <class Done>
bool spin(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  do {
    if (done()) return true;
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

}  // namespace

StreamOrder::StreamOrder(int device) : device_(device) {
  const DeviceScope scope(device_);
  compute_.stream = make_stream();
  copy_.stream = make_stream();
}

// ---- allocations ---------------------------------------------------------

void StreamOrder::track(const void* base, std::size_t bytes) {
  Allocation a;
  a.bytes = bytes;
  allocations_.emplace(reinterpret_cast<std::uintptr_t>(base), std::move(a));
}

void StreamOrder::untrack(const void* base) noexcept {
  allocations_.erase(reinterpret_cast<std::uintptr_t>(base));
}

StreamOrder::Allocations::const_iterator StreamOrder::containing(const void* p) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto it = allocations_.upper_bound(addr);
  if (it == allocations_.begin()) return allocations_.end();
  --it;
  return addr < it->first + it->second.bytes ? it : allocations_.end();
}

const StreamOrder::Allocation* StreamOrder::find(const void* p) const {
  const auto it = containing(p);
  return it == allocations_.end() ? nullptr : &it->second;
}

StreamOrder::Allocation* StreamOrder::find(const void* p) {
  return const_cast<Allocation*>(std::as_const(*this).find(p));
}

std::optional<StreamOrder::Extent> StreamOrder::allocation_of(const void* p) const {
  const auto it = containing(p);
  if (it == allocations_.end()) return std::nullopt;
  return Extent{reinterpret_cast<const void*>(it->first), it->second.bytes};
}

// ---- ordering ------------------------------------------------------------

std::pair<std::uint64_t, cudaEvent_t> StreamOrder::Timeline::mark_covering(std::uint64_t seq) {
  for (auto& [covered, event] : marks) {
    if (covered >= seq) return {covered, event.get()};
  }
  Event event;
  if (marks.size() >= kMaxMarks) {
    // Re-recording is safe: waits already issued on the old record keep it.
    event = std::move(marks.front().second);
    marks.pop_front();
  } else {
    event = make_event();
  }
  PSTRAIN_CUDA_CHECK(cudaEventRecord(event.get(), stream.get()));
  marks.emplace_back(issued, std::move(event));
  return {issued, marks.back().second.get()};
}

void StreamOrder::order_after(Timeline& waiter, Timeline& other, std::uint64_t seq) {
  if (seq <= waiter.waited_on_other) return;
  const auto [covered, event] = other.mark_covering(seq);
  PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(waiter.stream.get(), event, 0));
  waiter.waited_on_other = covered;
}

void StreamOrder::order_after_side(cudaStream_t stream, const void* p) {
  if (Allocation* a = find(p)) {
    if (!a->side) return;
    PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream, a->side.get(), 0));
    // Later ops on the allocation order after this one, so after the side
    // work too.
    a->side.reset();
    return;
  }
  for (const SideEvent& tail : side_tails_)
    PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream, tail.get(), 0));
}

void StreamOrder::before_compute(std::initializer_list<const void*> buffers) {
  std::uint64_t needed = 0;
  for (const void* p : buffers) {
    if (!p) continue;
    const Allocation* a = find(p);
    needed = std::max(needed, a ? a->copy_seq : copy_.issued);
    order_after_side(compute_stream(), p);
  }
  order_after(compute_, copy_, needed);
}

void StreamOrder::after_compute(std::initializer_list<const void*> buffers) noexcept {
  const std::uint64_t seq = ++compute_.issued;
  for (const void* p : buffers) {
    if (Allocation* a = p ? find(p) : nullptr) a->compute_seq = seq;
  }
}

void StreamOrder::before_compute_all() {
  order_after(compute_, copy_, copy_.issued);
  order_after_side(compute_stream(), nullptr);  // untracked: all side work
}

void StreamOrder::after_compute_all() noexcept {
  const std::uint64_t seq = ++compute_.issued;
  for (auto& [base, a] : allocations_) a.compute_seq = seq;
}

void StreamOrder::before_copy(const void* device_ptr) {
  const Allocation* a = find(device_ptr);
  order_after(copy_, compute_, a ? a->compute_seq : compute_.issued);
  order_after_side(copy_stream(), device_ptr);
}

void StreamOrder::after_copy(const void* device_ptr) {
  const std::uint64_t seq = ++copy_.issued;
  if (Allocation* a = find(device_ptr)) a->copy_seq = seq;
  // A mark after every copy: compute that needs this upload then waits for
  // it alone, not for the downloads issued after it (a mark recorded later,
  // at the stream's tail, would cover those too).
  copy_.mark_covering(seq);
}

void StreamOrder::before_side(cudaStream_t side, std::initializer_list<const void*> buffers) {
  std::uint64_t compute_needed = 0, copy_needed = 0;
  for (const void* p : buffers) {
    if (!p) continue;
    const Allocation* a = find(p);
    compute_needed = std::max(compute_needed, a ? a->compute_seq : compute_.issued);
    copy_needed = std::max(copy_needed, a ? a->copy_seq : copy_.issued);
    order_after_side(side, p);  // another side stream's work on it
  }
  // Not order_after: the side stream keeps no record of what it waited for.
  if (compute_needed > 0)
    PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(side, compute_.mark_covering(compute_needed).second, 0));
  if (copy_needed > 0)
    PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(side, copy_.mark_covering(copy_needed).second, 0));
}

void StreamOrder::after_side(cudaStream_t side, std::initializer_list<const void*> buffers) {
  SideEvent done(make_event().release(), EventDeleter{});
  PSTRAIN_CUDA_CHECK(cudaEventRecord(done.get(), side));
  for (const void* p : buffers) {
    if (Allocation* a = p ? find(p) : nullptr) a->side = done;
  }
  side_tails_.push_back(std::move(done));
}

void StreamOrder::add_watchdog(const void* owner, Watchdog check) {
  watchdogs_.emplace_back(owner, std::move(check));
}

void StreamOrder::remove_watchdog(const void* owner) noexcept {
  std::erase_if(watchdogs_, [owner](const auto& w) { return w.first == owner; });
}

// ---- fences --------------------------------------------------------------

Event StreamOrder::take_event() {
  if (spare_events_.empty()) return make_event();
  Event e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

bool StreamOrder::fence_complete(const PendingFence& f) const {
  for (cudaEvent_t e : {f.compute.get(), f.copy.get()}) {
    const cudaError_t status = cudaEventQuery(e);
    if (status == cudaErrorNotReady) return false;
    PSTRAIN_CUDA_CHECK(status);
  }
  return true;
}

void StreamOrder::retire_fences_through(Fence id) {
  while (!pending_fences_.empty() && pending_fences_.front().id <= id) {
    spare_events_.push_back(std::move(pending_fences_.front().compute));
    spare_events_.push_back(std::move(pending_fences_.front().copy));
    pending_fences_.pop_front();
  }
  retired_through_ = std::max(retired_through_, id);
}

StreamOrder::Fence StreamOrder::fence() {
  const DeviceScope scope(device_);
  // Completed fences are retired here too, so callers that never wait keep
  // the pending list short.
  while (!pending_fences_.empty() && fence_complete(pending_fences_.front())) {
    retire_fences_through(pending_fences_.front().id);
  }
  // Side work joins the compute stream here, so the fence covers it.
  for (const SideEvent& tail : side_tails_)
    PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), tail.get(), 0));
  side_tails_.clear();
  PendingFence f{next_fence_, take_event(), take_event()};
  PSTRAIN_CUDA_CHECK(cudaEventRecord(f.compute.get(), compute_.stream.get()));
  PSTRAIN_CUDA_CHECK(cudaEventRecord(f.copy.get(), copy_.stream.get()));
  pending_fences_.push_back(std::move(f));
  return next_fence_++;
}

bool StreamOrder::fence_done(Fence fence) {
  if (fence <= retired_through_) return true;
  check_dims(fence < next_fence_, "fence_done",
             "fence " + std::to_string(fence) + " was never issued");
  const DeviceScope scope(device_);
  const PendingFence& f = pending_fences_[fence - pending_fences_.front().id];
  if (!fence_complete(f)) return false;
  retire_fences_through(fence);
  return true;
}

void StreamOrder::wait(Fence fence) {
  if (fence <= retired_through_) return;
  check_dims(fence < next_fence_, "wait", "fence " + std::to_string(fence) + " was never issued");
  const DeviceScope scope(device_);
  const PendingFence& f = pending_fences_[fence - pending_fences_.front().id];
  const bool done = spin([&] { return fence_complete(f); });
  if (!done && watchdogs_.empty()) {
    PSTRAIN_CUDA_CHECK(cudaEventSynchronize(f.compute.get()));
    PSTRAIN_CUDA_CHECK(cudaEventSynchronize(f.copy.get()));
  } else if (!done) {
    // A collective whose peer died never completes; polling lets the
    // communicator's watchdog abort it and throw instead.
    const auto start = std::chrono::steady_clock::now();
    while (!fence_complete(f)) {
      for (const auto& [owner, check] : watchdogs_) check(seconds_since(start));
      std::this_thread::sleep_for(kSleep);
    }
  }
  retire_fences_through(fence);
}

bool StreamOrder::drain(double limit_s) noexcept {
  const auto start = std::chrono::steady_clock::now();
  const auto idle = [&] {
    const auto done = [](cudaError_t status, const char* call) {
      if (status == cudaErrorNotReady) return false;
      if (status != cudaSuccess) throw_cuda(status, call);
      return true;
    };
    for (cudaStream_t s : {compute_stream(), copy_stream()})
      if (!done(cudaStreamQuery(s), "cudaStreamQuery")) return false;
    for (const SideEvent& tail : side_tails_)
      if (!done(cudaEventQuery(tail.get()), "cudaEventQuery")) return false;
    return true;
  };
  try {
    if (spin(idle)) return true;
    while (!idle()) {
      const double waited = seconds_since(start);
      if (waited > limit_s) {
        std::fprintf(stderr, "pstrain cuda: device %d still busy after %.1f s\n", device_, waited);
        return false;
      }
      for (const auto& [owner, check] : watchdogs_) {
        try {
          check(waited);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "pstrain cuda: while draining: %s\n", e.what());
        }
      }
      std::this_thread::sleep_for(kSleep);
    }
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstrain cuda: %s\n", e.what());
    return false;
  }
}

}  // namespace pstrain::cuda
