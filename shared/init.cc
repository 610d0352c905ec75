#include "shared/init.h"

#include <cmath>
#include <numbers>

namespace pstrain {
namespace {

// Uniform in (0, 1): 24 random bits, offset by half a step so log() is finite.
double unit(std::uint64_t bits) { return (double(bits >> 40) + 0.5) / double(1 << 24); }

}  // namespace

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t seed) {
  std::uint64_t h = seed;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

float init_value(std::uint64_t seed, std::string_view variable, std::uint64_t element,
                 InitSpec spec) {
  if (spec.kind == InitKind::zeros) return 0.0f;
  const std::uint64_t key = splitmix64(seed ^ fnv1a64(variable));
  const std::uint64_t a = splitmix64(key ^ splitmix64(2 * element));
  if (spec.kind == InitKind::uniform) {
    return static_cast<float>((2.0 * unit(a) - 1.0) * spec.scale);
  }
  const std::uint64_t b = splitmix64(key ^ splitmix64(2 * element + 1));
  const double z = std::sqrt(-2.0 * std::log(unit(a))) * std::cos(2.0 * std::numbers::pi * unit(b));
  return static_cast<float>(z * spec.scale);
}

void init_fill(std::span<float> out, std::uint64_t seed, std::string_view variable,
               std::uint64_t first_element, InitSpec spec) {
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = init_value(seed, variable, first_element + i, spec);
}

}  // namespace pstrain
