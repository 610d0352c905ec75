#pragma once
// Initial values from a counter-based generator: element e of variable v under
// seed s is a pure function of (s, v, e). Every process computes the same
// value for the same element, in any order and any split, so the ps's
// create-if-absent init is idempotent no matter which worker gets there first.
#include <cstdint>
#include <span>
#include <string_view>

namespace pstrain {

enum class InitKind : std::uint8_t { zeros, uniform, normal };

struct InitSpec {
  InitKind kind = InitKind::zeros;
  float scale = 0.0f;  // uniform: values in [-scale, scale); normal: stddev
};

// splitmix64's output function: a well-mixed 64-bit hash of x, the step of
// every counter-based generator here (also client/train/straggler.h's).
std::uint64_t splitmix64(std::uint64_t x);

// 64-bit FNV-1a; also names variables in the generator's counter.
std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t seed = 0xcbf29ce484222325ULL);

float init_value(std::uint64_t seed, std::string_view variable, std::uint64_t element,
                 InitSpec spec);

// out[i] = init_value(seed, variable, first_element + i, spec).
void init_fill(std::span<float> out, std::uint64_t seed, std::string_view variable,
               std::uint64_t first_element, InitSpec spec);

}  // namespace pstrain
