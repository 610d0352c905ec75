#pragma once
// RAII owners of the CUDA objects the backend and the communicator hold:
// streams, events, a cuBLAS handle, device and pinned host buffers. Each is a
// unique_ptr with a deleter, so moves work and nothing leaks on an exception
// half-way through a constructor. Deleters cannot throw; a failure there is
// reported on stderr (it means the context is already broken).
#include <cstddef>
#include <cstdio>
#include <memory>
#include <type_traits>

#include "client/compute/cuda/cuda_check.h"

namespace pstrain::cuda {

inline void report_release_error(cudaError_t status, const char* call) noexcept {
  if (status != cudaSuccess && status != cudaErrorCudartUnloading) {
    std::fprintf(stderr, "pstrain cuda: %s failed: %s\n", call, cudaGetErrorString(status));
  }
}

struct StreamDeleter {
  void operator()(CUstream_st* s) const noexcept {
    report_release_error(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
};
using Stream = std::unique_ptr<CUstream_st, StreamDeleter>;

// A stream that does not synchronize with the legacy default stream, so
// nothing another library puts there stalls the backend.
inline Stream make_stream() {
  cudaStream_t s = nullptr;
  PSTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

struct EventDeleter {
  void operator()(CUevent_st* e) const noexcept {
    report_release_error(cudaEventDestroy(e), "cudaEventDestroy");
  }
};
using Event = std::unique_ptr<CUevent_st, EventDeleter>;

// Events for ordering and fences only: timing disabled makes record and
// query cheaper.
inline Event make_event() {
  cudaEvent_t e = nullptr;
  PSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(e);
}

// Events that time device work (cudaEventElapsedTime).
inline Event make_timing_event() {
  cudaEvent_t e = nullptr;
  PSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return Event(e);
}

struct CublasDeleter {
  void operator()(cublasContext* h) const noexcept {
    const cublasStatus_t status = cublasDestroy(h);
    if (status != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "pstrain cuda: cublasDestroy failed: %s\n",
                   cublasGetStatusString(status));
    }
  }
};
using Cublas = std::unique_ptr<cublasContext, CublasDeleter>;

inline Cublas make_cublas(cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  PSTRAIN_CUDA_CHECK(cublasCreate(&h));
  Cublas owned(h);
  PSTRAIN_CUDA_CHECK(cublasSetStream(h, stream));
  return owned;
}

struct DeviceFree {
  void operator()(void* p) const noexcept { report_release_error(cudaFree(p), "cudaFree"); }
};
struct HostFree {
  void operator()(void* p) const noexcept { report_release_error(cudaFreeHost(p), "cudaFreeHost"); }
};
template <class T>
using DeviceBuffer = std::unique_ptr<T[], DeviceFree>;
template <class T>
using PinnedBuffer = std::unique_ptr<T[], HostFree>;

template <class T>
DeviceBuffer<T> device_buffer(std::size_t count) {
  static_assert(std::is_trivially_copyable_v<T>);
  void* p = nullptr;
  PSTRAIN_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
  return DeviceBuffer<T>(static_cast<T*>(p));
}

// Portable pinned memory: any device's stream may copy from it, which the
// multi-GPU-per-process case (one backend per device) needs.
template <class T>
PinnedBuffer<T> pinned_buffer(std::size_t count) {
  static_assert(std::is_trivially_copyable_v<T>);
  void* p = nullptr;
  PSTRAIN_CUDA_CHECK(cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocPortable));
  return PinnedBuffer<T>(static_cast<T*>(p));
}

// Makes `device` current for the scope and restores the previous one, so a
// process driving several GPUs (one backend each) never issues work to the
// wrong device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    PSTRAIN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device)
      PSTRAIN_CUDA_CHECK(cudaSetDevice(device));
    else
      previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) report_release_error(cudaSetDevice(previous_), "cudaSetDevice");
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace pstrain::cuda
