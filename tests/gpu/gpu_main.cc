// The GPU tests' runner (tests/gpu/test_*.cc): every op against the
// double-precision reference, transfers and their ordering, fences, the
// optimizers against their shared per-element math, NCCL, step graphs
// (CUDA graphs) against eager steps, and a short training run. Needs only the
// CUDA libraries, libpstrain_cuda.so and headers, so it can be copied to a
// GPU host. Exits 77 (skipped) without a device; a case that needs more
// devices than the host has is left out and named on stdout, and the other
// cases decide the exit status (tests/support/gpu_exit.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include "tests/gpu/gpu_support.h"

using namespace pstrain::gpu_test;

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("gpu_tests: no CUDA device (%s): skipped\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return pstrain::testing::gpu_tests_exit_status(0, 0);
  }
  doctest::Context context(argc, argv);
  // Cases the host has too few devices for are skipped by name; the rest
  // decide the exit status.
  for (const auto& need : kNeedsDevices) {
    if (count >= need.devices) continue;
    std::printf("gpu_tests: skipped \"%s\": needs %d devices, this host has %d\n", need.test_case,
                need.devices, count);
    context.addFilter("test-case-exclude", need.test_case);
  }
  return pstrain::testing::gpu_tests_exit_status(count, context.run());
}
