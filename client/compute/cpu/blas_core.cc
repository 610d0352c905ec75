#include "client/compute/cpu/blas_core.h"

#include <algorithm>
#include <cctype>
#include <optional>

namespace pstrain {
namespace {

// OpenBLAS's x86-64 cores ranked by the widest vectors their sgemm uses:
// 0 SSE, 1 AVX, 2 AVX2+FMA, 3 AVX-512, 4 AVX-512 with BF16, 5 AMX.
std::optional<int> rank(std::string_view core) {
  struct Ranked {
    std::string_view name;
    int rank;
  };
  static constexpr Ranked kCores[] = {
      {"prescott", 0},      {"core2", 0},      {"penryn", 0},       {"dunnington", 0},
      {"nehalem", 0},       {"atom", 0},       {"opteron", 0},      {"barcelona", 0},
      {"nano", 0},          {"bobcat", 0},     {"opteron_sse3", 0}, {"sandybridge", 1},
      {"bulldozer", 1},     {"piledriver", 1}, {"steamroller", 1},  {"excavator", 1},
      {"haswell", 2},       {"zen", 2},        {"skylakex", 3},     {"cooperlake", 4},
      {"sapphirerapids", 5}};
  std::string lower(core);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const auto& c : kCores)
    if (c.name == lower) return c.rank;
  return std::nullopt;
}

}  // namespace

CpuFeatures host_cpu_features() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  return f;
}

BlasCoreChoice choose_blas_core(const CpuFeatures& cpu, std::string_view openblas_core,
                                const char* user_core) {
  const std::string own(openblas_core);
  if (user_core && *user_core)
    return {"", "OPENBLAS_CORETYPE=" + std::string(user_core) + " set by the user"};
  const bool avx512 = cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq;
  std::string best, why;
  if (avx512 && cpu.avx512bf16) {
    best = "Cooperlake";
    why = "AVX-512 F/BW/VL/DQ and BF16";
  } else if (avx512) {
    best = "SkylakeX";
    why = "AVX-512 F/BW/VL/DQ";
  } else if (cpu.avx2 && cpu.fma) {
    best = "Haswell";
    why = "AVX2 and FMA";
  } else {
    return {"", "no AVX2 with FMA: OpenBLAS's own " + own};
  }
  const auto own_rank = rank(own);
  if (!own_rank) return {"", "OpenBLAS's own " + own + ", a core this choice does not rank"};
  if (*own_rank >= *rank(best))
    return {"", "OpenBLAS's own " + own + ", at least as wide as " + best + " (" + why + ")"};
  return {best, "the CPU has " + why + "; OpenBLAS chose " + own};
}

}  // namespace pstrain
