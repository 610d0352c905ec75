#include "client/compute/cuda/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>

namespace pstrain::cuda {

NcclCommunicator::NcclCommunicator(CudaBackend& backend, const ncclUniqueId& id, int rank, int size,
                                   double timeout_s)
    : backend_(backend), rank_(rank), size_(size), timeout_s_(timeout_s) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("nccl: rank " + std::to_string(rank) +
                                " is not in a group of size " + std::to_string(size));
  }
  if (!(timeout_s > 0)) throw std::invalid_argument("nccl: timeout must be positive");
  const DeviceScope scope(backend_.device());
  stream_ = make_stream();
  last_collective_ = make_event();
  mark_ = make_timing_event();
  barrier_value_ = backend_.alloc(sizeof(float));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // ncclUniqueId is passed by value; the copy keeps `id` const.
  complete(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
  backend_.add_watchdog(this, [this](double waited_s) { watchdog(waited_s); });
}

NcclCommunicator::~NcclCommunicator() {
  backend_.remove_watchdog(this);
  if (!comm_) return;
  try {
    const DeviceScope scope(backend_.device());
    try {
      complete(ncclCommFinalize(comm_), "ncclCommFinalize");
    } catch (const std::exception& e) {
      // Finalize could not flush: abort instead of destroying, which would
      // wait for peers that may be gone.
      std::fprintf(stderr, "pstrain nccl: %s\n", e.what());
      if (comm_) ncclCommAbort(std::exchange(comm_, nullptr));  // fail() may have aborted it
      return;
    }
    // A destroy that fails must not be followed by an abort of the same
    // communicator, so the handle is given up first.
    const ncclResult_t destroyed = ncclCommDestroy(std::exchange(comm_, nullptr));
    if (destroyed != ncclSuccess)
      std::fprintf(stderr, "pstrain nccl: ncclCommDestroy failed: %s\n",
                   ncclGetErrorString(destroyed));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstrain nccl: %s\n", e.what());
  }
}

void NcclCommunicator::fail(const std::string& why) {
  const std::string last = comm_ ? ncclGetLastError(comm_) : "";
  if (comm_) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  throw CommError("nccl (rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                  "): " + why + (last.empty() ? "" : " [" + last + "]"));
}

void NcclCommunicator::complete(ncclResult_t issued, const char* call) {
  if (issued != ncclSuccess && issued != ncclInProgress) {
    fail(std::string(call) + " failed: " + ncclGetErrorString(issued));
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  if (!comm_) {
    if (issued == ncclSuccess) return;
    fail(std::string(call) + " returned no communicator");
  }
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) state = query;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail(std::string(call) + " failed: " + ncclGetErrorString(state));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      fail(std::string(call) + " did not complete within " + std::to_string(timeout_s_) +
           " s: a peer is missing, dead or stuck");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::check_alive() const {
  if (!comm_) {
    throw CommError("nccl (rank " + std::to_string(rank_) +
                    "): the communicator was aborted after an earlier failure");
  }
}

void NcclCommunicator::watchdog(double waited_s) {
  if (!comm_) return;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
  if (query != ncclSuccess) state = query;
  if (state != ncclSuccess && state != ncclInProgress) {
    fail(std::string("a collective failed: ") + ncclGetErrorString(state));
  }
  const cudaError_t done = cudaEventQuery(last_collective_.get());
  if (done != cudaSuccess && done != cudaErrorNotReady) {
    fail(std::string("cudaEventQuery on the last collective failed: ") + cudaGetErrorString(done));
  }
  if (waited_s > timeout_s_ && done == cudaErrorNotReady) {
    fail("a collective did not complete within " + std::to_string(timeout_s_) +
         " s: a peer is dead or stuck");
  }
}

template <class Issue>
void NcclCommunicator::collective(float* data, const char* call, Issue&& issue) {
  backend_.side(stream_.get(), {data}, [&] {
    if (timings_.size() < kTimed && timed_ == timings_.size())
      timings_.emplace_back(make_timing_event(), make_timing_event());
    auto& [start, end] = timings_[timed_ % kTimed];
    PSTRAIN_CUDA_CHECK(cudaEventRecord(start.get(), stream_.get()));
    complete(issue(), call);
    PSTRAIN_CUDA_CHECK(cudaEventRecord(end.get(), stream_.get()));
    PSTRAIN_CUDA_CHECK(cudaEventRecord(last_collective_.get(), stream_.get()));
    ++timed_;
  });
}

void NcclCommunicator::allreduce_sum(float* data, std::size_t n) {
  check_alive();
  if (n == 0) return;
  collective(data, "ncclAllReduce", [&] {
    return ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_.get());
  });
}

void NcclCommunicator::broadcast(float* data, std::size_t n, int root) {
  check_alive();
  if (root < 0 || root >= size_) {
    throw std::invalid_argument("nccl: broadcast root " + std::to_string(root) +
                                " is not a rank of a group of size " + std::to_string(size_));
  }
  if (n == 0) return;
  collective(data, "ncclBroadcast",
             [&] { return ncclBroadcast(data, data, n, ncclFloat, root, comm_, stream_.get()); });
}

void NcclCommunicator::mark() {
  backend_.compute(
      {}, [&](cudaStream_t stream) { PSTRAIN_CUDA_CHECK(cudaEventRecord(mark_.get(), stream)); });
  marked_ = true;
}

std::optional<Communicator::DeviceTimes> NcclCommunicator::device_times() {
  const DeviceScope scope(backend_.device());
  DeviceTimes times;
  const auto elapsed = [](const Event& from, const Event& to) {
    float ms = 0;
    PSTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, from.get(), to.get()));
    return double(ms);
  };
  for (std::size_t i = 0; i < std::min(timed_, kTimed); ++i)
    times.busy_ms += elapsed(timings_[i].first, timings_[i].second);
  if (timed_ > 0) {
    const Event& last_end = timings_[(timed_ - 1) % kTimed].second;
    times.after_mark_ms = marked_ ? std::max(0.0, elapsed(mark_, last_end)) : times.busy_ms;
  }
  timed_ = 0;
  marked_ = false;
  return times;
}

void NcclCommunicator::barrier() {
  allreduce_sum(barrier_value_.data(), 1);
  backend_.synchronize();
}

}  // namespace pstrain::cuda
