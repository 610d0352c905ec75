// The OpenBLAS core chosen from CPU features, on the feature sets of known
// CPUs and the cores Debian's OpenBLAS 0.3.21 picks for them by itself.
#include <doctest/doctest.h>

#include "client/compute/cpu/blas_core.h"

using namespace pstrain;

namespace {

CpuFeatures avx2_fma() {
  CpuFeatures f;
  f.avx2 = f.fma = true;
  return f;
}

CpuFeatures avx512() {
  CpuFeatures f = avx2_fma();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  return f;
}

CpuFeatures avx512_bf16() {
  CpuFeatures f = avx512();
  f.avx512bf16 = true;
  return f;
}

}  // namespace

TEST_CASE("blas core: Ice Lake Xeon that OpenBLAS does not know gets SkylakeX, not Prescott") {
  // "Intel(R) Xeon(R) Processor", CPUID model 106: AVX-512 without BF16.
  const auto c = choose_blas_core(avx512(), "Prescott", nullptr);
  CHECK(c.core == "SkylakeX");
  CHECK(c.reason.find("AVX-512") != std::string::npos);
  CHECK(c.reason.find("Prescott") != std::string::npos);
}

TEST_CASE("blas core: AMD EPYC Genoa (AVX-512 with BF16) run as Haswell or Zen gets Cooperlake") {
  CHECK(choose_blas_core(avx512_bf16(), "Haswell", nullptr).core == "Cooperlake");
  CHECK(choose_blas_core(avx512_bf16(), "Zen", nullptr).core == "Cooperlake");
}

TEST_CASE("blas core: Cooper Lake and Sapphire Rapids") {
  CHECK(choose_blas_core(avx512_bf16(), "Prescott", nullptr).core == "Cooperlake");
  // OpenBLAS's own core for a CPU it knows is kept when it is at least as wide.
  CHECK(choose_blas_core(avx512_bf16(), "Cooperlake", nullptr).core.empty());
  CHECK(choose_blas_core(avx512_bf16(), "SapphireRapids", nullptr).core.empty());
}

TEST_CASE("blas core: Skylake-SP recognised by OpenBLAS keeps SkylakeX") {
  const auto c = choose_blas_core(avx512(), "SkylakeX", nullptr);
  CHECK(c.core.empty());
  CHECK(c.reason.find("SkylakeX") != std::string::npos);
}

TEST_CASE("blas core: AVX2 CPUs (Zen 3, Skylake client) get Haswell only over a narrower core") {
  CHECK(choose_blas_core(avx2_fma(), "Zen", nullptr).core.empty());
  CHECK(choose_blas_core(avx2_fma(), "Haswell", nullptr).core.empty());
  CHECK(choose_blas_core(avx2_fma(), "Prescott", nullptr).core == "Haswell");
  CHECK(choose_blas_core(avx2_fma(), "Sandybridge", nullptr).core == "Haswell");
}

TEST_CASE("blas core: incomplete AVX-512 (Knights Landing: F without BW/VL/DQ) is Haswell") {
  CpuFeatures knl = avx2_fma();
  knl.avx512f = true;
  CHECK(choose_blas_core(knl, "Prescott", nullptr).core == "Haswell");
}

TEST_CASE("blas core: without AVX2 and FMA OpenBLAS's own core stays") {
  CpuFeatures sandy_bridge;  // AVX only
  CHECK(choose_blas_core(sandy_bridge, "Sandybridge", nullptr).core.empty());
  CpuFeatures no_fma = avx2_fma();
  no_fma.fma = false;
  CHECK(choose_blas_core(no_fma, "Prescott", nullptr).core.empty());
}

TEST_CASE("blas core: a core name this choice does not rank is kept") {
  CHECK(choose_blas_core(avx512_bf16(), "Zen5", nullptr).core.empty());
}

TEST_CASE("blas core: OPENBLAS_CORETYPE set by the user wins") {
  const auto c = choose_blas_core(avx512_bf16(), "Haswell", "Haswell");
  CHECK(c.core.empty());
  CHECK(c.reason.find("user") != std::string::npos);
  // An empty variable is no choice.
  CHECK(choose_blas_core(avx512_bf16(), "Haswell", "").core == "Cooperlake");
}

TEST_CASE("blas core: core names compare case-insensitively") {
  CHECK(choose_blas_core(avx512(), "skylakex", nullptr).core.empty());
  CHECK(choose_blas_core(avx512(), "PRESCOTT", nullptr).core == "SkylakeX");
}
