#pragma once
// All-reduce between the workers of a sync-mode run, over a backend's memory:
// Gloo (TCP) for CPU workers, NCCL (in the CUDA library) for GPU workers.
// Workers find each other through ps 0's key-value store (PsClient::kv_set /
// kv_get), so no extra process or shared file system is needed.
#include <cstddef>
#include <stdexcept>
#include <string>

namespace pstrain {

// A peer that died or hung surfaces as this error, naming the peer when the
// transport can tell which one.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl"

  // Sums n floats across all workers, in place. Gloo completes on return;
  // NCCL is ordered on the backend's compute stream, so later backend work
  // sees the result and the host sees it after a fence.
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  virtual void broadcast(float* data, std::size_t n, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace pstrain
