#include "shared/gradient_compression.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "shared/all_finite.h"

namespace pstrain {
namespace {

template <typename T>
void put(std::vector<std::uint8_t>& out, std::size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof value);
}

template <typename T>
T get(std::span<const std::uint8_t> frame, std::size_t at) {
  T value;
  std::memcpy(&value, frame.data() + at, sizeof value);
  return value;
}

// Whether element a goes before b in top-k's choice: larger magnitude, ties
// to the lower index (the same choice everywhere).
bool ahead(std::span<const float> v, std::uint32_t a, std::uint32_t b) {
  const float x = std::abs(v[a]), y = std::abs(v[b]);
  return x > y || (x == y && a < b);
}

// The indices of the k elements of `v` that go first, in index order, into
// `order`. A full selection over a chunk costs about 1 ms at the default
// chunk size, so for k well below n a sample of every stride-th element
// picks a magnitude t that about 2k elements reach; the elements reaching t
// are the candidates. When there are at least k of them, the k-th largest
// magnitude is at least t, so every element of the choice is a candidate
// and selecting among them gives exactly the full selection's indices; when
// the sample was unlucky (fewer than k), the full selection runs.
void select_topk(std::span<const float> v, std::size_t k, std::vector<std::uint32_t>& order) {
  constexpr std::size_t kSample = 1024;
  const std::size_t n = v.size();
  const auto by_rank = [&](std::uint32_t a, std::uint32_t b) { return ahead(v, a, b); };
  order.clear();
  if (n >= 4 * kSample && k * 8 <= n) {
    const std::size_t stride = n / kSample;
    thread_local std::vector<float> sample;
    sample.resize(kSample);
    for (std::size_t j = 0; j < kSample; ++j) sample[j] = std::abs(v[j * stride]);
    const std::size_t rank = std::min(kSample - 1, 2 * k * kSample / n + 4);
    std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank),
                     sample.end(), std::greater<>());
    const float t = sample[rank];
    for (std::size_t i = 0; i < n; ++i)
      if (std::abs(v[i]) >= t) order.push_back(static_cast<std::uint32_t>(i));
    if (order.size() < k) order.clear();
  }
  if (order.empty()) {
    order.resize(n);
    std::iota(order.begin(), order.end(), 0u);
  }
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                   by_rank);
  order.resize(k);
  std::ranges::sort(order);
}

void compress_topk(double ratio, std::span<const float> v, std::vector<std::uint8_t>& out,
                   std::span<float> residual) {
  const std::size_t n = v.size(), k = topk_count(ratio, n);
  // Reused: a chunk's index list is 256 KiB at the default chunk size, above
  // malloc's mmap threshold, so a fresh one per push would map, fault in and
  // unmap 64 pages every time.
  thread_local std::vector<std::uint32_t> order;
  select_topk(v, k, order);
  out.assign(sizeof(std::uint32_t) + k * (sizeof(std::uint32_t) + sizeof(float)), 0);
  put(out, 0, static_cast<std::uint32_t>(k));
  const std::size_t values = sizeof(std::uint32_t) * (1 + k);
  for (std::size_t i = 0; i < k; ++i) {
    put(out, sizeof(std::uint32_t) * (1 + i), order[i]);
    put(out, values + sizeof(float) * i, v[order[i]]);
  }
  if (residual.data() != v.data()) std::ranges::copy(v, residual.begin());
  for (const std::uint32_t i : order) residual[i] = 0;  // sent exactly
}

void compress_sign(std::span<const float> v, std::vector<std::uint8_t>& out,
                   std::span<float> residual) {
  const std::size_t n = v.size();
  double sum = 0;
  for (const float x : v) sum += std::abs(x);
  const float scale = n ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
  out.assign(sizeof(float) + (n + 7) / 8, 0);
  put(out, 0, scale);
  for (std::size_t i = 0; i < n; ++i) {
    const bool negative = std::signbit(v[i]);
    if (negative) out[sizeof(float) + i / 8] |= static_cast<std::uint8_t>(1u << (i % 8));
    residual[i] = v[i] - (negative ? -scale : scale);
  }
}

}  // namespace

Compression parse_compression(std::string_view text) {
  if (text == "none") return {};
  if (text == "sign") return {Compression::Kind::sign, 0};
  if (text.starts_with("topk:")) {
    const auto number = text.substr(5);
    double ratio = 0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), ratio);
    if (ec == std::errc() && end == number.data() + number.size() && ratio > 0 && ratio <= 1)
      return {Compression::Kind::topk, ratio};
  }
  throw std::invalid_argument("'" + std::string(text) +
                              "': expected none, sign, or topk:RATIO with 0 < RATIO <= 1 "
                              "(e.g. topk:0.01)");
}

std::string to_string(const Compression& c) {
  switch (c.kind) {
    case Compression::Kind::none:
      return "none";
    case Compression::Kind::sign:
      return "sign";
    case Compression::Kind::topk: {
      char text[32];
      const auto [end, ec] = std::to_chars(text, text + sizeof text, c.ratio);
      return "topk:" + std::string(text, ec == std::errc() ? end : text);
    }
  }
  return "none";
}

std::size_t topk_count(double ratio, std::size_t n) {
  const auto k = static_cast<std::size_t>(std::ceil(ratio * static_cast<double>(n)));
  return std::clamp<std::size_t>(k, n ? 1 : 0, n);
}

void compress(const Compression& c, std::span<const float> v, std::vector<std::uint8_t>& out,
              std::span<float> residual) {
  if (residual.size() != v.size())
    throw std::invalid_argument("compress: the residual must be as long as the gradient");
  // Refused here as the ps refuses a float32 one: top-k would never pick a
  // NaN and would carry it unseen in the residual forever.
  if (!all_finite(v)) throw std::invalid_argument("compress: the gradient has a non-finite value");
  switch (c.kind) {
    case Compression::Kind::topk:
      return compress_topk(c.ratio, v, out, residual);
    case Compression::Kind::sign:
      return compress_sign(v, out, residual);
    case Compression::Kind::none:
      break;
  }
  throw std::invalid_argument("compress: no compression configured");
}

void decompress(Compression::Kind kind, std::span<const std::uint8_t> frame, std::span<float> out) {
  const std::size_t n = out.size();
  if (kind == Compression::Kind::sign) {
    if (frame.size() != sizeof(float) + (n + 7) / 8)
      throw std::invalid_argument("sign frame of " + std::to_string(frame.size()) + " bytes for " +
                                  std::to_string(n) + " elements");
    const float scale = get<float>(frame, 0);
    if (!std::isfinite(scale)) throw std::invalid_argument("sign frame: scale not finite");
    for (std::size_t i = 0; i < n; ++i)
      out[i] = frame[sizeof(float) + i / 8] >> (i % 8) & 1u ? -scale : scale;
    return;
  }
  if (kind != Compression::Kind::topk) throw std::invalid_argument("not a compressed frame");
  if (frame.size() < sizeof(std::uint32_t))
    throw std::invalid_argument("top-k frame of " + std::to_string(frame.size()) + " bytes");
  const std::size_t k = get<std::uint32_t>(frame, 0);
  if (k > n || frame.size() != sizeof(std::uint32_t) * (1 + k) + sizeof(float) * k)
    throw std::invalid_argument("top-k frame of " + std::to_string(frame.size()) + " bytes with " +
                                std::to_string(k) + " elements for a chunk of " +
                                std::to_string(n));
  std::ranges::fill(out, 0.0f);
  const std::size_t values = sizeof(std::uint32_t) * (1 + k);
  std::int64_t previous = -1;
  for (std::size_t i = 0; i < k; ++i) {
    const std::uint32_t at = get<std::uint32_t>(frame, sizeof(std::uint32_t) * (1 + i));
    if (at >= n || static_cast<std::int64_t>(at) <= previous)
      throw std::invalid_argument("top-k frame: index " + std::to_string(at) +
                                  " out of range or not ascending");
    const float value = get<float>(frame, values + sizeof(float) * i);
    if (!std::isfinite(value)) throw std::invalid_argument("top-k frame: value not finite");
    out[at] = value;
    previous = at;
  }
}

}  // namespace pstrain
