#pragma once
// The CUDA backend's two streams and the order between them.
//
// Math runs on one compute stream (cuBLAS is bound to it); upload and
// download run on a copy stream, so transfers overlap with unrelated math.
// The backend's contract is issue order: every call behaves as if the calls
// before it had finished. StreamOrder keeps that promise per allocation
// instead of serializing the streams: it remembers, for every tracked
// allocation, the last compute op and the last copy that touched it, and
// makes one stream wait for the other (with events) only where an op touches
// an allocation the other stream still has work on:
//   - a download waits for the compute that wrote the buffer (read after
//     write), then runs while later, unrelated compute proceeds;
//   - an upload waits for compute that still reads or writes its destination
//     (write after read), and compute that reads the uploaded buffer waits for
//     the upload;
//   - compute that writes a buffer still being downloaded waits for that
//     download.
// A pointer that is not tracked orders against everything issued on the
// other stream. Host memory is not tracked: it must stay valid until a fence
// issued after the transfer completes (backend.h).
//
// Work on a side stream (the NCCL communicator's collectives) is ordered the
// same way: before_side makes the side stream wait for the compute and copies
// already issued on its buffers, after_side records the work's end on each
// of them, and later compute or copies that touch one of those buffers wait
// for it; other work overlaps it. A fence joins all side work issued before
// it into the compute stream, so fences cover it.
//
// Fences record an event on both streams; fence_done queries them and wait
// spins on them briefly, then blocks, polling the registered watchdogs (the
// NCCL communicator's dead-peer check) instead of blocking forever when any
// are registered. drain() waits for both streams with a deadline, for the
// release paths (cudaFree and cudaFreeHost wait for the whole device, and
// must never wait for a kernel that does not end).
//
// Every op is bracketed: before_compute / before_copy, enqueue the work on
// the stream, after_compute / after_copy. One thread drives it.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "client/compute/backend.h"
#include "client/compute/cuda/cuda_memory.h"

namespace pstrain::cuda {

class StreamOrder {
 public:
  using Fence = Backend::Fence;
  // A check wait() runs while it polls a fence: it gets the seconds waited so
  // far and throws to abandon the wait. Keyed by the owner, which removes it
  // before it dies.
  using Watchdog = std::function<void(double waited_s)>;

  // Makes both streams on `device`, which fences and waits make current.
  explicit StreamOrder(int device);

  cudaStream_t compute_stream() const { return compute_.stream.get(); }
  cudaStream_t copy_stream() const { return copy_.stream.get(); }

  // Device allocations whose ops are ordered per allocation.
  void track(const void* base, std::size_t bytes);
  void untrack(const void* base) noexcept;
  // The tracked allocation that contains `p`: its base and size.
  struct Extent {
    const void* base;
    std::size_t bytes;
  };
  std::optional<Extent> allocation_of(const void* p) const;

  // Around compute that reads or writes `buffers` (null entries ignored).
  void before_compute(std::initializer_list<const void*> buffers);
  void after_compute(std::initializer_list<const void*> buffers) noexcept;
  // Around compute that may touch any allocation (a replayed CUDA graph,
  // whose kernels the backend does not see one by one): it waits for every
  // copy and side op issued before it, and later ops on any allocation wait
  // for it.
  void before_compute_all();
  void after_compute_all() noexcept;
  // Around a transfer to or from `device_ptr`.
  void before_copy(const void* device_ptr);
  void after_copy(const void* device_ptr);
  // Around work on stream `side` that reads or writes `buffers`.
  void before_side(cudaStream_t side, std::initializer_list<const void*> buffers);
  void after_side(cudaStream_t side, std::initializer_list<const void*> buffers);

  Fence fence();
  bool fence_done(Fence fence);
  void wait(Fence fence);
  // Waits until both streams are idle, polling the watchdogs (a watchdog's
  // error is reported and the wait goes on: its abort ends the stuck
  // collective). False when work is still running after `limit_s` seconds or
  // a query failed (reported on stderr). The device must be current.
  bool drain(double limit_s) noexcept;

  void add_watchdog(const void* owner, Watchdog check);
  void remove_watchdog(const void* owner) noexcept;

 private:
  // The end of one side op, shared by the allocations it touched.
  using SideEvent = std::shared_ptr<CUevent_st>;

  struct Allocation {
    std::size_t bytes = 0;
    std::uint64_t compute_seq = 0;  // last compute op that touched it
    std::uint64_t copy_seq = 0;     // last copy that touched it
    SideEvent side;                 // side work on it no stream has waited for yet
  };

  // The ops issued on one stream, numbered from 1, with events recorded after
  // some of them (every copy; compute ops when a copy needs them) so the
  // other stream can wait for "op s and everything before". Old marks are recycled; waiting on a
  // later mark than needed is still correct, only less concurrent.
  struct Timeline {
    Stream stream;
    std::uint64_t issued = 0;
    std::uint64_t waited_on_other = 0;  // the other stream's ops this one waits for
    std::deque<std::pair<std::uint64_t, Event>> marks;
    // An event that completes once op `seq` has, and the last op it covers;
    // records one when no recorded mark covers `seq`.
    std::pair<std::uint64_t, cudaEvent_t> mark_covering(std::uint64_t seq);
  };

  struct PendingFence {
    Fence id;
    Event compute, copy;
  };

  using Allocations = std::map<std::uintptr_t, Allocation>;  // by base address

  Allocations::const_iterator containing(const void* p) const;
  const Allocation* find(const void* p) const;
  Allocation* find(const void* p);
  // Makes `waiter` wait for the ops of `other` up to `seq`.
  static void order_after(Timeline& waiter, Timeline& other, std::uint64_t seq);
  // Makes `stream` wait for the side work on `p`'s allocation (on all side
  // work not yet joined, when `p` is untracked).
  void order_after_side(cudaStream_t stream, const void* p);
  Event take_event();
  void retire_fences_through(Fence id);
  bool fence_complete(const PendingFence& f) const;

  int device_;
  Timeline compute_;
  Timeline copy_;
  Allocations allocations_;
  Fence next_fence_ = 1;
  Fence retired_through_ = 0;
  std::deque<PendingFence> pending_fences_;
  std::vector<SideEvent> side_tails_;  // side work issued since the last fence
  std::vector<Event> spare_events_;
  std::vector<std::pair<const void*, Watchdog>> watchdogs_;
};

}  // namespace pstrain::cuda
