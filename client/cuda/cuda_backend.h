#pragma once
// CudaBackend: the Backend interface on one GPU.
//
// Streams. Math runs on one compute stream (cuBLAS is bound to it); upload and
// download run on a copy stream, so transfers overlap with unrelated math.
// The contract is issue order: every call behaves as if the calls before it
// had finished. The backend keeps that promise per allocation instead of
// serializing the streams: it remembers, for every allocation, the last
// compute op and the last copy that touched it, and makes one stream wait for
// the other (with events) only where a call touches an allocation the other
// stream still has work on:
//   - a download waits for the compute that wrote the buffer (read after
//     write), then runs while later, unrelated compute proceeds;
//   - an upload waits for compute that still reads or writes its destination
//     (write after read), and compute that reads the uploaded buffer waits for
//     the upload;
//   - compute that writes a buffer still being downloaded waits for that
//     download.
// A pointer the backend did not allocate orders against everything issued on
// the other stream. Host memory is not tracked: it must stay valid until a
// fence issued after the transfer completes (backend.h).
//
// Fences record an event on both streams; fence_done queries them and wait
// blocks on them, polling the registered watchdogs (the NCCL communicator's
// dead-peer check) instead of blocking forever when any are registered.
//
// One thread drives a backend. Every call makes the backend's device current
// for its duration, so one process may drive several GPUs.
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/backend.h"
#include "client/cuda/cuda_memory.h"

namespace pstrain::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  bool host_accessible() const override { return false; }
  int device() const { return device_; }

  DeviceMemory alloc(std::size_t bytes) override;
  HostMemory alloc_host(std::size_t bytes) override;
  void release(void* device_ptr) noexcept override;
  void release_host(void* host_ptr) noexcept override;

  void upload(const void* host, void* device, std::size_t bytes) override;
  void download(const void* device, void* host, std::size_t bytes) override;
  void fill(float* device, float value, std::size_t n) override;

  Fence fence() override;
  bool fence_done(Fence fence) override;
  void wait(Fence fence) override;

  void dense_forward(const float* x, const float* w, const float* b, float* y,
                     int n, int in, int out) override;
  void dense_backward(const float* x, const float* w, const float* dy, float* dx,
                      float* dw, float* db, int n, int in, int out) override;
  void relu_forward(const float* x, float* y, std::size_t n) override;
  void relu_backward(const float* y, const float* dy, float* dx,
                     std::size_t n) override;
  std::size_t conv2d_workspace(const ConvShape& s) const override;
  void conv2d_forward(const float* x, const float* w, const float* b, float* y,
                      float* workspace, const ConvShape& s) override;
  void conv2d_backward(const float* x, const float* w, const float* dy,
                       float* dx, float* dw, float* db, float* workspace,
                       const ConvShape& s) override;
  void maxpool_forward(const float* x, float* y, std::int32_t* argmax,
                       const PoolShape& s) override;
  void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx,
                        const PoolShape& s) override;
  void softmax_xent(const float* logits, const std::int32_t* labels,
                    float* dlogits, float* loss, float* correct, int n,
                    int classes) override;
  void scale(float* x, float a, std::size_t n) override;
  void apply_optimizer(const OptimizerConfig& config, float* w, const float* g,
                       float* state, std::size_t n, std::uint64_t step,
                       float lr_scale) override;

  // For work issued from outside the backend (NCCL collectives): orders the
  // compute stream after pending copies of `buffers`, runs `enqueue` with the
  // compute stream, and records the buffers as touched by it.
  template <class F>
  void compute(std::initializer_list<const void*> buffers, F&& enqueue) {
    const DeviceScope scope(device_);
    before_compute(buffers);
    enqueue(compute_.stream.get());
    after_compute(buffers);
  }

  // A check wait() runs while it polls a fence: it gets the seconds waited so
  // far and throws to abandon the wait. Keyed by the owner, which removes it
  // before it dies.
  using Watchdog = std::function<void(double waited_s)>;
  void add_watchdog(const void* owner, Watchdog check);
  void remove_watchdog(const void* owner) noexcept;

 private:
  struct Allocation {
    DeviceBuffer<std::byte> memory;
    std::size_t bytes = 0;
    std::uint64_t compute_seq = 0;  // last compute op that touched it
    std::uint64_t copy_seq = 0;     // last copy that touched it
  };

  // The ops issued on one stream, numbered from 1, with events recorded after
  // some of them so the other stream can wait for "op s and everything
  // before". Old marks are recycled; waiting on a later mark than needed is
  // still correct, only less concurrent.
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

  Allocation* find(const void* p);
  // Makes `waiter` wait for the ops of `other` up to `seq`.
  void order_after(Timeline& waiter, Timeline& other, std::uint64_t seq);
  void before_compute(std::initializer_list<const void*> buffers);
  void after_compute(std::initializer_list<const void*> buffers);
  void before_copy(const void* device_ptr);
  void after_copy(const void* device_ptr);
  Event take_event();
  void retire_fences_through(Fence id);
  bool fence_complete(const PendingFence& f) const;

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
            const float* b, float beta, float* c);
  int conv_chunk(const ConvShape& s) const;

  int device_;
  std::string name_;
  int sm_count_ = 1;
  Timeline compute_;
  Timeline copy_;
  Cublas cublas_;
  std::map<std::uintptr_t, Allocation> allocations_;
  std::unordered_map<void*, PinnedBuffer<std::byte>> host_allocations_;
  Fence next_fence_ = 1;
  Fence retired_through_ = 0;
  std::deque<PendingFence> pending_fences_;
  std::vector<Event> spare_events_;
  std::vector<std::pair<const void*, Watchdog>> watchdogs_;
};

}  // namespace pstrain::cuda
