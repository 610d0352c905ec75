#pragma once
// All-reduce between the workers of a sync-mode run, over a backend's memory:
// Gloo (TCP) for CPU workers, NCCL (in the CUDA library) for GPU workers.
// Workers find each other through ps 0's key-value store (PsControlClient::kv_set /
// kv_get), so no extra process or shared file system is needed.
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>

#include "shared/error.h"

namespace pstrain {

// A peer that died or hung surfaces as this error, naming the peer when the
// transport can tell which one.
struct CommError : pstrain::Error {
  using pstrain::Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl"

  // Sums n floats across all workers, in place. Gloo completes on return;
  // NCCL runs on its own stream after the backend work already issued on
  // `data`, and later backend work on `data` waits for it (the rest
  // overlaps it); the host sees the result after a fence.
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  virtual void broadcast(float* data, std::size_t n, int root) = 0;
  virtual void barrier() = 0;

  // Collectives that run after their call returns (NCCL) cannot be timed on
  // the host, which sees only the enqueue; such communicators time them on
  // the device. mark() notes the end of the backend work issued so far (the
  // end of backward); device_times(), called once a fence issued after the
  // collectives has completed, reports the collectives since its previous
  // call. Communicators that complete on return (Gloo) report nothing: the
  // host's timing of their calls is exact.
  struct DeviceTimes {
    double busy_ms = 0;        // the collectives' device time, summed
    double after_mark_ms = 0;  // from the mark to the last one's end (busy_ms without a mark)
  };
  virtual void mark() {}
  virtual std::optional<DeviceTimes> device_times() { return std::nullopt; }
};

}  // namespace pstrain
