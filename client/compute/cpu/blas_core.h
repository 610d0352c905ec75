#pragma once
// Which OpenBLAS core (its set of kernels) the CPU backend runs, chosen from
// the CPU's features rather than its model name. Debian's OpenBLAS 0.3.21
// picks a core by CPUID model: on Xeons it does not know it falls back to the
// SSE3 "Prescott" kernels, and on AMD EPYCs with AVX-512 it runs the AVX2
// "Haswell" ones, 1.3-1.7x slower there than the AVX-512 cores. The choice is
// a pure function of a feature set, so it is tested on the features of known
// CPUs; host_cpu_features() reads this CPU's.
#include <string>
#include <string_view>

namespace pstrain {

// The instruction-set extensions that decide between OpenBLAS's x86-64 cores,
// each one usable (the CPU has it and the OS saves its registers).
struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512bf16 = false;
};

CpuFeatures host_cpu_features();

struct BlasCoreChoice {
  std::string core;    // the OPENBLAS_CORETYPE to switch to; empty: keep OpenBLAS's own
  std::string reason;  // why, for the log
};

// The best core for `cpu`: Cooperlake with AVX-512 F/BW/VL/DQ and BF16,
// SkylakeX with AVX-512 F/BW/VL/DQ, Haswell with AVX2 and FMA. It replaces
// `openblas_core` (OpenBLAS's own choice, as openblas_get_corename() names
// it) only where that core uses narrower vectors; a core this function does
// not know is kept. `user_core` is OPENBLAS_CORETYPE (null when unset): the
// user's choice always wins, and OpenBLAS has already applied it.
BlasCoreChoice choose_blas_core(const CpuFeatures& cpu, std::string_view openblas_core,
                                const char* user_core);

}  // namespace pstrain
