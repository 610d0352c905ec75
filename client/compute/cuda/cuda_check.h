#pragma once
// Every CUDA runtime, cuBLAS and NCCL call of the library goes through one of
// these checks, which turn a failure into an exception naming the call and
// the library's own error text, e.g.
//   "cudaMalloc(&ptr, bytes) failed: out of memory (cudaErrorMemoryAllocation)".
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "client/comm/communicator.h"
#include "shared/error.h"

namespace pstrain::cuda {

struct CudaError : pstrain::Error {
  using pstrain::Error::Error;
};

[[noreturn]] inline void throw_cuda(cudaError_t status, const char* call) {
  throw CudaError(std::string(call) + " failed: " + cudaGetErrorString(status) + " (" +
                  cudaGetErrorName(status) + ")");
}

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw_cuda(status, call);
}

inline void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw CudaError(std::string(call) + " failed: " + cublasGetStatusString(status) + " (" +
                    cublasGetStatusName(status) + ")");
  }
}

// NCCL failures are communication failures (a peer, the network, an abort),
// so they surface as CommError like Gloo's do.
// ncclInProgress is not success: callers of nonblocking communicators wait it
// out first (nccl_communicator.cc).
inline void check(ncclResult_t status, const char* call) {
  if (status != ncclSuccess) {
    throw CommError(std::string(call) + " failed: " + ncclGetErrorString(status));
  }
}

// A backend call whose arguments it cannot work with (shapes, ranges, fence
// ids): a caller's mistake, not a device failure.
inline void check_dims(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("cuda backend: ") + op + ": " + what);
}

// Kernel launches report bad configurations only through the last error.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace pstrain::cuda

// The call's text becomes the message, so the macro is the one place the
// source spells each call once.
#define PSTRAIN_CUDA_CHECK(call) ::pstrain::cuda::check((call), #call)
