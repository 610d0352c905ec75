#pragma once
// Which `pstrain` the multi-process tests start. A build folder may be
// copied to another host (a GPU host: tools/gpu_check), where the absolute
// path CMake knew at build time does not exist, so the binary is looked for
// relative to the running test first:
//   1. $PSTRAIN, when set (the user's word wins);
//   2. `pstrain` beside the test executable, then one folder up (the build
//      tree keeps tests in build/tests/ and the binary in build/);
//   3. the path the build baked in (PSTRAIN_BINARY), the last resort.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace pstrain::testing {

// The rule above for a test at `exe`, with $PSTRAIN's value `env` (null when
// unset) and the baked-in path `built`: a pure function, so it is testable.
inline std::filesystem::path pstrain_binary_for(const std::filesystem::path& exe, const char* env,
                                                const std::filesystem::path& built) {
  if (env && *env) return env;
  std::error_code ec;
  for (const auto& dir : {exe.parent_path(), exe.parent_path().parent_path()}) {
    const auto candidate = dir / "pstrain";
    if (!dir.empty() && std::filesystem::is_regular_file(candidate, ec)) return candidate;
  }
  return built;
}

#ifdef PSTRAIN_BINARY
inline std::string pstrain_binary() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return pstrain_binary_for(ec ? std::filesystem::path() : exe, std::getenv("PSTRAIN"),
                            PSTRAIN_BINARY)
      .string();
}
#endif

}  // namespace pstrain::testing
