// The bf16 and fp16 rounding helpers against values worked out by hand: ties
// to even, overflow to infinity, subnormals, signs and NaN. The GPU kernels
// call the same functions, so these pin down what they compute too.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "shared/low_precision.h"

using namespace pstrain;

namespace {
float from_bits(std::uint32_t u) { return half_bits::to_float(u); }
}  // namespace

TEST_CASE("bf16 rounds to nearest, ties to even") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  // 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7 (odd): down.
  CHECK(float_to_bf16(from_bits(0x3f808000u)) == 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  CHECK(float_to_bf16(from_bits(0x3f818000u)) == 0x3f82);
  // Just above and below a half: nearest.
  CHECK(float_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
  CHECK(float_to_bf16(from_bits(0x3f807fffu)) == 0x3f80);
  // The mantissa's carry raises the exponent: 2 - 2^-9 rounds to 2.
  CHECK(float_to_bf16(from_bits(0x3fffc000u)) == 0x4000);
  CHECK(bf16_to_float(0x3f81) == from_bits(0x3f810000u));
}

TEST_CASE("bf16 overflow, infinities, NaN and subnormals") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_bf16(inf) == 0x7f80);
  CHECK(float_to_bf16(-inf) == 0xff80);
  // The largest float is above the midpoint past bf16's largest finite value.
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(float_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);  // below it: finite
  // A NaN whose payload sits only in the dropped half stays a NaN.
  CHECK(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // float32 subnormals keep their top bits (bf16 has float32's exponent).
  CHECK(float_to_bf16(from_bits(0x00010000u)) == 0x0001);
  CHECK(float_to_bf16(from_bits(0x00008000u)) == 0x0000);  // tie to even 0
  CHECK(float_to_bf16(-0.0f) == 0x8000);
}

TEST_CASE("fp16 rounds to nearest, ties to even") {
  CHECK(float_to_fp16(1.0f) == 0x3c00);
  CHECK(float_to_fp16(-2.0f) == 0xc000);
  CHECK(float_to_fp16(0.5f) == 0x3800);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to even, 1.
  CHECK(float_to_fp16(1.0f + 0x1p-11f) == 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: up.
  CHECK(float_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(float_to_fp16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  CHECK(fp16_to_float(0x3c01) == 1.0f + 0x1p-10f);
  CHECK(float_to_fp16(3.14159265f) == 0x4248);
}

TEST_CASE("fp16 overflows to infinity from 65520 up") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_fp16(65504.0f) == 0x7bff);
  CHECK(float_to_fp16(65519.0f) == 0x7bff);
  // 65520 is the midpoint between 65504 (odd mantissa) and 65536: to even,
  // which is past the largest finite value.
  CHECK(float_to_fp16(65520.0f) == 0x7c00);
  CHECK(float_to_fp16(1e6f) == 0x7c00);
  CHECK(float_to_fp16(-1e6f) == 0xfc00);
  CHECK(float_to_fp16(inf) == 0x7c00);
  CHECK(fp16_to_float(0x7c00) == inf);
  CHECK(fp16_to_float(0xfc00) == -inf);
  CHECK(float_to_fp16(std::nanf("")) == 0x7e00);
  CHECK(std::isnan(fp16_to_float(0x7e00)));
}

TEST_CASE("fp16 subnormals are kept, not flushed") {
  CHECK(float_to_fp16(0x1p-14f) == 0x0400);  // smallest normal
  CHECK(float_to_fp16(0x1p-24f) == 0x0001);  // smallest subnormal
  CHECK(fp16_to_float(0x0001) == 0x1p-24f);
  CHECK(fp16_to_float(0x03ff) == 1023 * 0x1p-24f);
  // Half the smallest subnormal ties to even (zero); a bit more rounds up.
  CHECK(float_to_fp16(0x1p-25f) == 0x0000);
  CHECK(float_to_fp16(0x1.8p-25f) == 0x0001);
  // 1.5 and 2.5 times the smallest subnormal: ties to 2 and 2.
  CHECK(float_to_fp16(3 * 0x1p-25f) == 0x0002);
  CHECK(float_to_fp16(5 * 0x1p-25f) == 0x0002);
  CHECK(float_to_fp16(-0x1p-24f) == 0x8001);
  CHECK(float_to_fp16(-0.0f) == 0x8000);
  CHECK(float_to_fp16(0x1p-30f) == 0x0000);
}

TEST_CASE("every finite half survives a round trip through float") {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f16 = fp16_to_float(bits);
    if (!std::isnan(f16)) REQUIRE(float_to_fp16(f16) == bits);
    const float b16 = bf16_to_float(bits);
    if (!std::isnan(b16)) REQUIRE(float_to_bf16(b16) == bits);
  }
}

TEST_CASE("buffer conversions match the per-element ones") {
  std::vector<float> in = {0.1f, -3.75f, 70000.0f, 1e-7f, 0.0f};
  for (HalfFormat format : {HalfFormat::bf16, HalfFormat::fp16}) {
    std::vector<std::uint16_t> encoded(in.size());
    std::vector<float> out(in.size());
    encode_halves(format, in.data(), encoded.data(), in.size());
    decode_halves(format, encoded.data(), out.data(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      CHECK(encoded[i] == encode_half(format, in[i]));
      CHECK(out[i] == round_to_half(format, in[i]));
    }
  }
  CHECK(round_to_half(HalfFormat::fp16, 70000.0f) == std::numeric_limits<float>::infinity());
  CHECK(round_to_half(HalfFormat::bf16, 70000.0f) == 70144.0f);
}
