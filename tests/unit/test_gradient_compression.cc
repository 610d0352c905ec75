// Compressed gradients (shared/gradient_compression.h): what top-k and sign
// send, what they keep (error feedback: sent + kept is the input), that
// nothing is lost over many steps, and malformed frames refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "shared/gradient_compression.h"

using namespace pstrain;

namespace {

std::vector<float> decoded(Compression::Kind kind, const std::vector<std::uint8_t>& frame,
                           std::size_t n) {
  std::vector<float> out(n, 42.0f);
  decompress(kind, frame, out);
  return out;
}

}  // namespace

TEST_CASE("gradient compression: names parse and print") {
  CHECK(parse_compression("none") == Compression{});
  CHECK(parse_compression("sign").kind == Compression::Kind::sign);
  const auto topk = parse_compression("topk:0.01");
  CHECK(topk.kind == Compression::Kind::topk);
  CHECK(topk.ratio == 0.01);
  CHECK(to_string(topk) == "topk:0.01");
  CHECK(parse_compression(to_string(topk)) == topk);
  for (const char* bad : {"topk:0", "topk:1.5", "topk:", "topk:x", "gzip", "", "topk:-0.1"}) {
    INFO(bad);
    CHECK_THROWS_WITH_AS(parse_compression(bad), doctest::Contains("expected none, sign, or topk"),
                         std::invalid_argument);
  }
  CHECK(topk_count(0.01, 1000) == 10);
  CHECK(topk_count(0.01, 50) == 1);  // at least one
  CHECK(topk_count(1, 7) == 7);
}

TEST_CASE("gradient compression: top-k sends the largest, keeps the rest exactly") {
  const std::vector<float> v = {0.1f, -5, 3, 0, 2, -3};
  std::vector<std::uint8_t> frame;
  std::vector<float> residual(v.size());
  compress(parse_compression("topk:0.5"), v, frame, residual);
  CHECK(frame.size() == 4 + 3 * 8);
  CHECK(decoded(Compression::Kind::topk, frame, v.size()) ==
        std::vector<float>{0, -5, 3, 0, 0, -3});
  CHECK(residual == std::vector<float>{0.1f, 0, 0, 0, 2, 0});
  // In place: the residual may be the input itself.
  std::vector<float> w = v;
  compress(parse_compression("topk:0.5"), w, frame, w);
  CHECK(w == residual);
}

TEST_CASE("gradient compression: top-k of a whole chunk is the full sort's choice, ties and all") {
  // 65,536 values on a grid of 0.01 (many ties); the elements a full sort
  // puts first (magnitude, then the lower index) are what must be sent,
  // whether the sampled threshold finds them or the full selection does.
  const std::size_t n = 1 << 16;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = std::round(normal(rng) * 100) / 100;
  // Unlucky for the sample: every 64th element (those sampled) large, the
  // rest small, so fewer than k elements reach its threshold.
  std::vector<float> skewed(n, 0.001f);
  for (std::size_t i = 0; i < n; i += 64) skewed[i] = 1 + static_cast<float>(i % 7);
  for (const auto* values : {&v, &skewed}) {
    for (const double ratio : {0.001, 0.01, 0.05, 0.1, 0.5}) {
      INFO("ratio " << ratio << (values == &skewed ? ", skewed" : ""));
      const std::size_t k = topk_count(ratio, n);
      std::vector<std::uint32_t> expected(n);
      for (std::uint32_t i = 0; i < n; ++i) expected[i] = i;
      std::ranges::stable_sort(expected, [&](std::uint32_t a, std::uint32_t b) {
        return std::abs((*values)[a]) > std::abs((*values)[b]);
      });
      expected.resize(k);
      std::ranges::sort(expected);
      std::vector<std::uint8_t> frame;
      std::vector<float> residual(n);
      compress(Compression{Compression::Kind::topk, ratio}, *values, frame, residual);
      REQUIRE(frame.size() == 4 + k * 8);
      std::vector<std::uint32_t> sent(k);
      std::memcpy(sent.data(), frame.data() + 4, k * 4);
      CHECK(sent == expected);
    }
  }
}

TEST_CASE("gradient compression: a non-finite gradient is refused, not carried") {
  std::vector<float> v(1 << 14, 0.5f);
  std::vector<std::uint8_t> frame;
  std::vector<float> residual(v.size());
  for (const float bad : {std::nanf(""), INFINITY}) {
    v[777] = bad;
    for (const char* kind : {"topk:0.01", "sign"})
      CHECK_THROWS_WITH_AS(compress(parse_compression(kind), v, frame, residual),
                           doctest::Contains("non-finite"), std::invalid_argument);
  }
}

TEST_CASE("gradient compression: sign sends the mean magnitude and one bit an element") {
  const std::vector<float> v = {1, -2, 3, -4, 0.5f, -0.5f, 2, 1, -1};
  std::vector<std::uint8_t> frame;
  std::vector<float> residual(v.size());
  compress(parse_compression("sign"), v, frame, residual);
  CHECK(frame.size() == 4 + 2);
  const float scale = 15.0f / 9;
  const auto out = decoded(Compression::Kind::sign, frame, v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    INFO(i);
    CHECK(out[i] == (v[i] < 0 ? -scale : scale));
    CHECK(out[i] + residual[i] == doctest::Approx(v[i]));
  }
}

TEST_CASE("gradient compression: with error feedback nothing is lost over many steps") {
  // What reached the ps plus what the worker still carries is every
  // gradient it was given.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  for (const char* kind : {"topk:0.05", "sign"}) {
    INFO(kind);
    const auto c = parse_compression(kind);
    const std::size_t n = 300;
    std::vector<double> given(n, 0), arrived(n, 0);
    std::vector<float> carried(n, 0), v(n);
    std::vector<std::uint8_t> frame;
    std::size_t bytes = 0;
    for (int step = 0; step < 200; ++step) {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = normal(rng);
        given[i] += g;
        v[i] = g + carried[i];
      }
      compress(c, v, frame, carried);
      bytes += frame.size();
      const auto out = decoded(c.kind, frame, n);
      for (std::size_t i = 0; i < n; ++i) arrived[i] += out[i];
    }
    for (std::size_t i = 0; i < n; i += 7) {
      INFO(i);
      CHECK(arrived[i] + carried[i] == doctest::Approx(given[i]).epsilon(1e-3).scale(10));
    }
    // The stated bytes: 8 an element sent plus a count, or a bit an
    // element plus a scale (against float32's 1,200 a step).
    CHECK(bytes == 200 * (c.kind == Compression::Kind::sign ? 4 + (n + 7) / 8
                                                            : 4 + 8 * topk_count(0.05, n)));
  }
}

TEST_CASE("gradient compression: malformed frames are refused by name") {
  std::vector<float> out(10);
  const auto frame_of = [](std::uint32_t k, std::vector<std::uint32_t> at, std::vector<float> v) {
    std::vector<std::uint8_t> f(4 + 8 * at.size());
    std::memcpy(f.data(), &k, 4);
    // memcpy must not get an empty vector's data(), which may be null.
    if (!at.empty()) std::memcpy(f.data() + 4, at.data(), 4 * at.size());
    if (!v.empty()) std::memcpy(f.data() + 4 + 4 * at.size(), v.data(), 4 * v.size());
    return f;
  };
  const auto refused = [&](Compression::Kind kind, const std::vector<std::uint8_t>& f,
                           const char* why) {
    INFO(why);
    CHECK_THROWS_WITH_AS(decompress(kind, f, out), doctest::Contains(why), std::invalid_argument);
  };
  using K = Compression::Kind;
  CHECK_NOTHROW(decompress(K::topk, frame_of(2, {1, 9}, {1, 2}), out));
  CHECK(out[9] == 2);
  refused(K::topk, {1, 2}, "top-k frame of 2 bytes");
  refused(K::topk, frame_of(11, {}, {}), "with 11 elements for a chunk of 10");
  refused(K::topk, frame_of(3, {1, 9}, {1, 2}), "with 3 elements");
  refused(K::topk, frame_of(2, {9, 1}, {1, 2}), "not ascending");
  refused(K::topk, frame_of(2, {1, 1}, {1, 2}), "not ascending");
  refused(K::topk, frame_of(1, {10}, {1}), "out of range");
  refused(K::topk, frame_of(1, {3}, {std::nanf("")}), "not finite");
  refused(K::sign, std::vector<std::uint8_t>(5), "sign frame of 5 bytes for 10 elements");
  std::vector<std::uint8_t> nan_scale(6);
  const float nan = std::nanf("");
  std::memcpy(nan_scale.data(), &nan, 4);
  refused(K::sign, nan_scale, "scale not finite");
  refused(K::none, {}, "not a compressed frame");
}
