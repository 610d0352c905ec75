#pragma once
// The dense layers' GEMMs with their bias work fused into the GEMM's epilogue
// through cuBLASLt: forward adds the bias as it writes y (one pass over y,
// not a broadcast kernel and then a read-modify-write GEMM), and backward's
// weight-gradient GEMM also writes the bias gradient (no column-sum kernel).
//
// Each call plans once per shape (descriptors and the algorithm cuBLASLt's
// heuristic picks for float32 math, no TF32) and returns false, enqueueing
// nothing, where no algorithm serves the shape or a pointer is not 16-byte
// aligned: the caller then takes its unfused path, which computes the same.
// One LtDense belongs to one backend and its compute stream, on whose thread
// it is used.
#include <cublasLt.h>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

#include "client/compute/cuda/cuda_memory.h"

namespace pstrain::cuda {

class LtDense {
 public:
  // Allocates its workspace on the current device.
  explicit LtDense(cudaStream_t stream);
  ~LtDense();
  LtDense(const LtDense&) = delete;
  LtDense& operator=(const LtDense&) = delete;

  // Row-major y[n x out] = x[n x in] w[in x out] + b[out].
  bool forward(const float* x, const float* w, const float* b, float* y, int n, int in, int out);
  // dw[in x out] = x^T dy and db[out] = column sums of dy[n x out].
  bool weight_grad(const float* x, const float* dy, float* dw, float* db, int n, int in, int out);

  // The workspace, for the backend's release paths (which free it only once
  // the streams drained).
  DeviceBuffer<std::byte>& workspace() { return workspace_; }

 private:
  struct Plan;
  enum class Kind { forward, weight_grad };
  // The plan of one shape, or null when cuBLASLt has no algorithm for it.
  Plan* plan(Kind kind, int n, int in, int out);
  // False where cuBLASLt refuses the plan's algorithm after all.
  bool run(Plan& plan, const void* a, const void* b, void* d, const void* bias);
  // Plans (once) and runs; a refused plan is dropped, its shape unfused since.
  bool call(Kind kind, int n, int in, int out, const void* a, const void* b, void* d,
            const void* bias);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<std::byte> workspace_;
  std::map<std::tuple<Kind, int, int, int>, std::unique_ptr<Plan>> plans_;
};

}  // namespace pstrain::cuda
