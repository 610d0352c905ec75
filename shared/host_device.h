#pragma once
// PSTRAIN_HD marks per-element functions that g++ compiles for the CPU
// backend and nvcc compiles for CUDA kernels, so both backends share (and the
// CPU tests cover) one definition of every activation, loss term and
// optimizer step.
#if defined(__CUDACC__)
#define PSTRAIN_HD __host__ __device__ inline
#else
#define PSTRAIN_HD inline
#endif
