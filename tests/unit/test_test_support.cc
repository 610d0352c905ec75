// The helpers the multi-process and GPU test executables rely on to report
// honestly: which pstrain binary they start, and what their exit status says.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>

#include "tests/support/child_process.h"
#include "tests/support/gpu_exit.h"
#include "tests/support/pstrain_binary.h"

using pstrain::testing::pstrain_binary_for;

TEST_CASE("test support: a copied build folder starts the pstrain beside its tests") {
  pstrain::TempDir dir;
  const auto build = dir.path() / "copied-build";
  std::filesystem::create_directories(build / "tests");
  const auto exe = build / "tests" / "test_gpu_training";
  const std::filesystem::path baked = "/nonexistent/build/pstrain";
  // No pstrain near the test: the baked path is all there is.
  CHECK(pstrain_binary_for(exe, nullptr, baked) == baked);
  // build/tests/test_x finds build/pstrain, the build tree's layout ...
  std::ofstream(build / "pstrain") << "";
  CHECK(pstrain_binary_for(exe, nullptr, baked) == build / "pstrain");
  // ... and a pstrain beside the test is nearer still.
  std::ofstream(build / "tests" / "pstrain") << "";
  CHECK(pstrain_binary_for(exe, nullptr, baked) == build / "tests" / "pstrain");
  // $PSTRAIN wins over both; an empty one counts as unset.
  CHECK(pstrain_binary_for(exe, "/opt/pstrain/bin/pstrain", baked) == "/opt/pstrain/bin/pstrain");
  CHECK(pstrain_binary_for(exe, "", baked) == build / "tests" / "pstrain");
  // A folder named pstrain is not the binary.
  std::filesystem::remove(build / "tests" / "pstrain");
  std::filesystem::create_directories(build / "tests" / "pstrain");
  CHECK(pstrain_binary_for(exe, nullptr, baked) == build / "pstrain");
}

TEST_CASE("test support: GPU tests skip (77) only where no device is usable") {
  using pstrain::testing::gpu_tests_exit_status;
  CHECK(gpu_tests_exit_status(0, 0) == 77);
  // One GPU, the two-GPU cases left out by name: the rest decides.
  CHECK(gpu_tests_exit_status(1, 0) == 0);
  CHECK(gpu_tests_exit_status(1, 3) == 3);
  CHECK(gpu_tests_exit_status(2, 0) == 0);
}
