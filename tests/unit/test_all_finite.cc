// all_finite (shared/all_finite.h) against std::isfinite: every class of
// float alone, every bit pattern of a random sample, and one NaN or infinity
// at every place of spans whose lengths cover the vectorized loop's body and
// its tail.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "shared/all_finite.h"

using namespace pstrain;

namespace {
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
bool one_finite(float v) { return all_finite(std::span<const float>(&v, 1)); }
}  // namespace

TEST_CASE("all_finite agrees with std::isfinite on every kind of float") {
  using L = std::numeric_limits<float>;
  for (const float v : {0.0f, -0.0f, 1.0f, -1.0f, L::max(), L::lowest(), L::min(), L::denorm_min(),
                        -L::denorm_min(), from_bits(0x7f7fffff), from_bits(0x00000001)})
    CHECK(one_finite(v));
  for (const float v : {L::infinity(), -L::infinity(), L::quiet_NaN(), -L::quiet_NaN(),
                        L::signaling_NaN(), from_bits(0x7f800001), from_bits(0xffffffff)})
    CHECK_FALSE(one_finite(v));
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float v = from_bits(static_cast<std::uint32_t>(rng()));
    REQUIRE(one_finite(v) == static_cast<bool>(std::isfinite(v)));
  }
  CHECK(all_finite({}));
}

TEST_CASE("all_finite finds one NaN or infinity at any place of a span") {
  for (std::size_t n = 1; n <= 70; ++n) {
    std::vector<float> values(n, 0.5f);
    REQUIRE(all_finite(values));
    for (std::size_t at = 0; at < n; ++at)
      for (const float bad :
           {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN()}) {
        values[at] = bad;
        REQUIRE_FALSE(all_finite(values));
        values[at] = -3.0e38f;
      }
    CHECK(all_finite(values));
  }
}
