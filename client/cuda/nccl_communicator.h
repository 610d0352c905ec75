#pragma once
// NcclCommunicator: NCCL all-reduce and broadcast on a CudaBackend's compute
// stream, so collectives are ordered with the backend's math and copies like
// any other compute op.
//
// The communicator is nonblocking (ncclConfig_t::blocking = 0): every NCCL
// call returns at once and the communicator polls ncclCommGetAsyncError with
// a deadline. A collective's completion is observed in the backend's fence
// wait, where the communicator registers a watchdog. A peer that never joins,
// dies or hangs therefore ends in ncclCommAbort and a CommError after
// `timeout_s`, never in a hang; the communicator is unusable afterwards.
#include <cstdint>
#include <string>

#include "client/cuda/cuda_backend.h"
#include "client/sync/communicator.h"

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

 private:
  // Waits out ncclInProgress for `call`; aborts and throws on an error or
  // after the timeout.
  void complete(ncclResult_t issued, const char* call);
  [[noreturn]] void fail(const std::string& why);
  void check_alive() const;
  void watchdog(double waited_s);

  CudaBackend& backend_;
  int rank_, size_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  Event last_collective_;
  DeviceMemory barrier_value_;
};

}  // namespace pstrain::cuda
