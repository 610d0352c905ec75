#pragma once
// The exit status of the GPU test executables (gpu_tests,
// test_gpu_training), which ctest and tools/gpu_check read: 77 means
// "skipped" and is kept for a host with no usable device. A case that needs
// more devices than the host has is reported as skipped by name and left
// out; the executable still passes or fails on the cases that ran, so a
// healthy one-GPU host reads as passed, never as skipped.
namespace pstrain::testing {

inline constexpr int kSkippedExit = 77;

// `devices`: usable devices (0: none, or no driver); `failed`: doctest's
// result over the cases that ran.
inline int gpu_tests_exit_status(int devices, int failed) {
  return devices <= 0 ? kSkippedExit : failed;
}

}  // namespace pstrain::testing
