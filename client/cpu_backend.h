#pragma once
// The CPU backend: OpenBLAS sgemm for every product, im2col convolutions
// batched into one large GEMM per chunk of samples, and the per-element
// arithmetic of client/elementwise.h and shared/optimizer_math.h. Work runs
// synchronously on the calling thread, so every fence is complete at once
// and DeviceMemory is plain 64-byte-aligned host memory.
#include <memory>

#include "client/backend.h"

namespace pstrain {

// `threads` sets OpenBLAS's thread count, which is process-wide: the last
// backend created decides it. Throws std::invalid_argument when threads < 1.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace pstrain
