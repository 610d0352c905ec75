#pragma once
// Compressed gradients for dense pushes (net.compression; docs/scaling.md,
// "Gradient compression"): what a worker sends instead of a chunk's float32
// gradient where the link, not the compute, bounds a step, and how the ps
// reads it back into float32 before its optimizer applies it as usual.
//
// Both kinds keep what they did not send on the worker (error feedback):
// the worker compresses v = gradient + carried error, and carries
// v - decode(sent) into the next push of the variable, so every part of
// every gradient reaches the ps eventually, late rather than lost.
//
// - topk:RATIO (Aji and Heafield 2017; Lin et al., "Deep Gradient
//   Compression", 2018): per chunk the ceil(RATIO x n) elements of largest
//   magnitude, as (u32 count, count x u32 index ascending, count x f32
//   value); 8 bytes an element sent, so RATIO 0.01 sends 2% of the bytes.
// - sign (EF-SignSGD, Karimireddy et al. 2019): per chunk one f32 scale,
//   the mean |v|, and one bit per element (1: negative), each element
//   decoded as +-scale; 1/32 of the bytes.
//
// Thread rules: none (pure functions; top-k keeps a scratch list per thread).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pstrain {

struct Compression {
  enum class Kind { none, topk, sign };
  Kind kind = Kind::none;
  double ratio = 0;  // topk: the fraction of each chunk's elements sent, in (0, 1]

  bool operator==(const Compression&) const = default;
};

// "none", "topk:0.01", "sign"; throws std::invalid_argument naming the text
// and what is expected otherwise.
Compression parse_compression(std::string_view text);
std::string to_string(const Compression& compression);

// The elements top-k sends of a chunk of n.
std::size_t topk_count(double ratio, std::size_t n);

// Encodes `v` (one chunk's gradient plus its carried error) as `kind`
// into `out` (replacing its contents) and writes into `residual` (v.size()
// floats; may alias v) what the ps will not see: v - decode(out). Throws
// std::invalid_argument when v holds a NaN or an infinity.
void compress(const Compression& compression, std::span<const float> v,
              std::vector<std::uint8_t>& out, std::span<float> residual);

// Decodes a compressed frame of a chunk of out.size() elements into `out`.
// Throws std::invalid_argument naming what is wrong with a malformed one:
// a size that does not fit, a count above n, indices out of range or not
// ascending, a non-finite value or scale.
void decompress(Compression::Kind kind, std::span<const std::uint8_t> frame, std::span<float> out);

}  // namespace pstrain
