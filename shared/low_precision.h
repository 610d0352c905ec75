#pragma once
// Rounding between float32 and the two 16-bit float formats: bfloat16 (8-bit
// exponent, 7-bit mantissa: float32's range) and IEEE binary16 "fp16" (5-bit
// exponent, 10-bit mantissa, largest finite 65504).
//
// Every conversion rounds to nearest, ties to even, as the hardware does
// (cuBLAS, AVX-512 BF16, F16C), so what the CPU tests pin down is what a GPU
// kernel computes: these are PSTRAIN_HD functions both g++ and nvcc build.
// Overflow gives an infinity of the right sign (fp16: from 65520 up), NaN stays
// a (quiet) NaN, and fp16 keeps its subnormals (down to 2^-24) rather than
// flushing them to zero.
//
// The encoded values are the formats' bit patterns in a std::uint16_t, which
// is how they travel on the wire and sit in memory.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "shared/host_device.h"

namespace pstrain {

enum class HalfFormat { bf16, fp16 };

namespace half_bits {
PSTRAIN_HD std::uint32_t of(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
PSTRAIN_HD float to_float(std::uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace half_bits

PSTRAIN_HD std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = half_bits::of(f);
  // A NaN's payload may sit in the low half only; keep it a NaN (quiet bit).
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  // Adding 0x7fff plus the kept part's lowest bit rounds ties to even; a carry
  // out of the mantissa raises the exponent, up to infinity.
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

PSTRAIN_HD float bf16_to_float(std::uint16_t h) {
  return half_bits::to_float(static_cast<std::uint32_t>(h) << 16);
}

// After F. Giesen's float_to_half_fast3_rtne: normal results round with
// integer arithmetic; subnormal ones let one float addition (itself round to
// nearest even) align the 10 mantissa bits at the bottom.
PSTRAIN_HD std::uint16_t float_to_fp16(float f) {
  std::uint32_t u = half_bits::of(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  std::uint32_t h;
  if (u >= 0x47800000u) {  // |f| >= 2^16, infinity or NaN
    h = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // |f| < 2^-14: subnormal or zero
    const float denorm_magic = half_bits::to_float(((127 - 15) + (23 - 10) + 1) << 23);
    h = half_bits::of(half_bits::to_float(u) + denorm_magic) - half_bits::of(denorm_magic);
  } else {
    const std::uint32_t mantissa_odd = (u >> 13) & 1u;
    u += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
    h = u >> 13;  // a carry past 65504 lands on 0x7c00, infinity
  }
  return static_cast<std::uint16_t>(h | sign);
}

PSTRAIN_HD float fp16_to_float(std::uint16_t h) {
  const std::uint32_t shifted_exponent = 0x7c00u << 13;
  std::uint32_t u = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
  const std::uint32_t exponent = u & shifted_exponent;
  u += static_cast<std::uint32_t>(127 - 15) << 23;
  if (exponent == shifted_exponent) {  // infinity or NaN
    u += static_cast<std::uint32_t>(128 - 16) << 23;
  } else if (exponent == 0) {  // zero or subnormal: renormalize through a float
    u += 1u << 23;
    u = half_bits::of(half_bits::to_float(u) - half_bits::to_float(113u << 23));
  }
  return half_bits::to_float(u | ((static_cast<std::uint32_t>(h) & 0x8000u) << 16));
}

PSTRAIN_HD std::uint16_t encode_half(HalfFormat format, float f) {
  return format == HalfFormat::bf16 ? float_to_bf16(f) : float_to_fp16(f);
}
PSTRAIN_HD float decode_half(HalfFormat format, std::uint16_t h) {
  return format == HalfFormat::bf16 ? bf16_to_float(h) : fp16_to_float(h);
}
// The float nearest to f that the format can hold (what storing f in it and
// reading it back gives).
PSTRAIN_HD float round_to_half(HalfFormat format, float f) {
  return decode_half(format, encode_half(format, f));
}

#if !defined(__CUDACC__)
// Whole buffers, on the CPU (the sender converts before a send, the receiver
// after; see net.wire_dtype and train.precision).
inline void encode_halves(HalfFormat format, const float* in, std::uint16_t* out, std::size_t n) {
  if (format == HalfFormat::bf16) {
    for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = float_to_fp16(in[i]);
  }
}
inline void decode_halves(HalfFormat format, const std::uint16_t* in, float* out, std::size_t n) {
  if (format == HalfFormat::bf16) {
    for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = fp16_to_float(in[i]);
  }
}

inline const char* half_format_name(HalfFormat format) {
  return format == HalfFormat::bf16 ? "bf16" : "fp16";
}
#endif

}  // namespace pstrain
