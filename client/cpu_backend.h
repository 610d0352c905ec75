#pragma once
// The CPU backend: OpenBLAS sgemm for the dense layers, convolutions through
// oneDNN (client/onednn_conv.h) or as im2col batched into one large GEMM per
// chunk of samples, and the per-element
// arithmetic of client/elementwise.h and shared/optimizer_math.h. Work runs
// synchronously on the calling thread, so every fence is complete at once
// and DeviceMemory is plain 64-byte-aligned host memory.
#include <memory>

#include "client/backend.h"

namespace pstrain {

// How the convolutions run. Both compute the same function to float
// rounding (tests/unit/test_layers.cc holds both to the double reference);
// im2col stays so the two can be measured against each other.
enum class CpuConv { onednn, im2col };

// The environment's choice, PSTRAIN_CPU_CONV=onednn|im2col, else onednn, the
// faster (README, Benchmarks). Throws std::invalid_argument on another value.
CpuConv cpu_conv_from_env();

// `threads` sets OpenBLAS's thread count, which is process-wide: the last
// backend created decides it; oneDNN gets the same count on every call.
// Throws std::invalid_argument when threads < 1.
std::unique_ptr<Backend> make_cpu_backend(int threads, CpuConv conv = cpu_conv_from_env());

}  // namespace pstrain
