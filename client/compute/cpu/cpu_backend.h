#pragma once
// The CPU backend: the dense layers and convolutions through oneDNN
// (client/compute/cpu/onednn_dense.h, client/compute/cpu/onednn_conv.h), or through OpenBLAS sgemm
// with im2col convolutions batched into one large GEMM per chunk of
// samples; max pooling and the per-element
// arithmetic of client/compute/elementwise.h and shared/optimizer_math.h. Work runs
// synchronously on the calling thread, so every fence is complete at once
// and DeviceMemory is plain 64-byte-aligned host memory.
#include <memory>

#include "client/compute/backend.h"

namespace pstrain {

// Which library runs the dense layers and convolutions. Both compute the
// same functions to float rounding (tests/unit/test_layers.cc holds both to
// the double reference); OpenBLAS stays so the two can be measured against
// each other in one run.
enum class CpuKernels { onednn, openblas };

// The environment's choice, PSTRAIN_CPU_KERNELS=onednn|openblas, else onednn,
// the faster (README, Benchmarks). Throws std::invalid_argument on another
// value.
CpuKernels cpu_kernels_from_env();

// `threads` sets OpenBLAS's thread count, which is process-wide: the last
// backend created decides it; oneDNN gets the same count on every call.
// Throws std::invalid_argument when threads < 1.
std::unique_ptr<Backend> make_cpu_backend(int threads, CpuKernels kernels = cpu_kernels_from_env());

}  // namespace pstrain
