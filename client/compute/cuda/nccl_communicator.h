#pragma once
// NcclCommunicator: NCCL all-reduce and broadcast on a stream of its own,
// ordered against a CudaBackend's streams per buffer (CudaBackend::side): a
// collective waits for the backend work already issued on its buffer, later
// work on that buffer waits for it, and everything else (the rest of
// backward) runs alongside it. Fences cover the collectives issued before
// them. Each collective is timed on the device (Communicator::device_times).
//
// The communicator is nonblocking (ncclConfig_t::blocking = 0): every NCCL
// call returns at once and the communicator polls ncclCommGetAsyncError with
// a deadline. A collective's completion is observed in the backend's fence
// wait, where the communicator registers a watchdog. A peer that never joins,
// dies or hangs therefore ends in ncclCommAbort and a CommError after
// `timeout_s`, never in a hang; the communicator is unusable afterwards.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/comm/communicator.h"
#include "client/compute/cuda/cuda_backend.h"

namespace pstrain::cuda {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CudaBackend& backend, const ncclUniqueId& id, int rank, int size,
                   double timeout_s);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void allreduce_sum(float* data, std::size_t n) override;
  void broadcast(float* data, std::size_t n, int root) override;
  // A one-float all-reduce, then a wait for the compute stream.
  void barrier() override;

  void mark() override;
  std::optional<DeviceTimes> device_times() override;

 private:
  // Waits out ncclInProgress for `call`; aborts and throws on an error or
  // after the timeout.
  void complete(ncclResult_t issued, const char* call);
  [[noreturn]] void fail(const std::string& why);
  void check_alive() const;
  void watchdog(double waited_s);
  // Issues one collective on `data` (`issue` makes the NCCL call on stream_),
  // between timing events.
  template <class Issue>
  void collective(float* data, const char* call, Issue&& issue);

  CudaBackend& backend_;
  int rank_, size_;
  double timeout_s_;
  Stream stream_;
  ncclComm_t comm_ = nullptr;
  Event last_collective_;
  DeviceMemory barrier_value_;
  // Start and end events of the collectives since device_times(); at most
  // kTimed of them, the oldest recycled beyond (device_times is asked every
  // step, a few dozen collectives).
  static constexpr std::size_t kTimed = 1024;
  std::vector<std::pair<Event, Event>> timings_;
  std::size_t timed_ = 0;
  Event mark_;
  bool marked_ = false;
};

}  // namespace pstrain::cuda
