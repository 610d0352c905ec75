// The CUDA backend's element-wise ops and optimizers: all_finite, axpby,
// fill, scale, apply_optimizer(s) against the shared per-element math.
#include "tests/gpu/gpu_support.h"

using namespace pstrain::gpu_test;

namespace {

TEST_CASE("all_finite and axpby") {
  auto b = make_backend();
  Buffer<> x(*b, 100000), y(*b, 100000);
  b->fill(x.data(), 2.0f, x.size);
  b->fill(y.data(), std::nanf(""), y.size);
  CHECK(b->all_finite(x.data(), x.size));
  CHECK_FALSE(b->all_finite(y.data(), y.size));
  b->axpby(0.5f, x.data(), 0.0f, y.data(), y.size);  // b == 0 ignores the NaNs
  CHECK(b->all_finite(y.data(), y.size));
  b->axpby(3.0f, x.data(), 2.0f, y.data(), y.size);  // 3 * 2 + 2 * 1
  for (float v : y.read())
    if (v != 8.0f) FAIL("axpby gave " << v);
  b->fill(x.data() + 77777, INFINITY, 1);
  CHECK_FALSE(b->all_finite(x.data(), x.size));
  CHECK(b->all_finite(x.data(), 77777));
}

// The default axpby synchronizes: behind held compute it would not return
// until the hold ends.
TEST_CASE("axpby is queued on the compute stream, in order, without waiting for it") {
  auto b = make_backend();
  const std::size_t n = 300001;
  std::mt19937 rng(12);
  const auto x = random_vector(n, rng), y = random_vector(n, rng);
  Buffer<> bx(*b, x), by(*b, y);
  ComputeHold hold(*b);
  const auto start = std::chrono::steady_clock::now();
  b->scale(bx.data(), 2.0f, n);
  b->axpby(0.5f, bx.data(), -3.0f, by.data(), n);  // after the scale: y = x - 3 y
  b->axpby(1.0f, bx.data(), 1.0f, by.data(), n);   // y = 3 x - 3 y
  const double issued_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(issued_s < 1.0);
  hold.release();
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = 3.0 * x[i] - 3.0 * y[i];
  check_close(by.read(), want, "axpby", 1e-6);
}

TEST_CASE("fill and scale") {
  auto b = make_backend();
  Buffer<> x(*b, 100000);
  b->fill(x.data(), 1.5f, x.size);
  b->scale(x.data() + 10, -2.0f, 100);
  const auto got = x.read();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != (i >= 10 && i < 110 ? -3.0f : 1.5f)) FAIL("element " << i << " is " << got[i]);
  }
}

TEST_CASE("apply_optimizer matches the shared per-element math") {
  auto b = make_backend();
  std::mt19937 rng(6);
  const std::size_t n = 5000;
  for (auto kind : {pstrain::OptimizerKind::sgd, pstrain::OptimizerKind::momentum,
                    pstrain::OptimizerKind::adam, pstrain::OptimizerKind::adagrad}) {
    for (bool nesterov : {false, true}) {
      pstrain::OptimizerConfig c;
      c.kind = kind;
      c.lr = 0.05f;
      c.nesterov = nesterov;
      c.weight_decay = 0.01f;
      const std::size_t slots = kind == pstrain::OptimizerKind::adam  ? 2
                                : kind == pstrain::OptimizerKind::sgd ? 0
                                                                      : 1;
      auto w = random_vector(n, rng);
      std::vector<float> state(
          n * slots, kind == pstrain::OptimizerKind::adagrad ? c.initial_accumulator : 0.0f);
      Buffer<> bw(*b, w), bstate(*b, state.empty() ? std::vector<float>(1) : state), bg(*b, n);
      for (std::uint64_t step = 1; step <= 3; ++step) {
        const auto g = random_vector(n, rng);
        b->upload(g.data(), bg.data(), n * sizeof(float));
        b->apply_optimizer(c, bw.data(), bg.data(), bstate.data(), n, step, 0.5f);
        b->synchronize();
        const auto s = pstrain::opt::OptimizerStep::make(c, n, step, 0.5f);
        for (std::size_t i = 0; i < n; ++i) s.apply(i, w[i], g[i], state.data());
      }
      INFO("optimizer " << int(kind) << " nesterov " << nesterov);
      check_close(bw.read(), widen(w), "weights", 1e-5);
      if (slots) check_close(bstate.read(), widen(state), "state", 1e-5);
    }
  }
}

// More tensors than one launch takes (kMultiTensor, 32), empty ones among
// them, and sizes from 1 to several grid strides.
TEST_CASE("apply_optimizers equals apply_optimizer on each tensor, bit for bit") {
  auto b = make_backend();
  std::mt19937 rng(13);
  std::vector<std::size_t> sizes;
  for (std::size_t t = 0; t < 70; ++t) sizes.push_back(t % 9 == 4 ? 0 : (t * 7919) % 5000 + 1);
  sizes[3] = 1 << 21;
  sizes[40] = 700001;
  for (auto kind : {pstrain::OptimizerKind::sgd, pstrain::OptimizerKind::momentum,
                    pstrain::OptimizerKind::adam, pstrain::OptimizerKind::adagrad}) {
    pstrain::OptimizerConfig c;
    c.kind = kind;
    c.lr = 0.05f;
    c.nesterov = kind == pstrain::OptimizerKind::momentum;
    c.weight_decay = 0.01f;
    const std::size_t slots = kind == pstrain::OptimizerKind::adam  ? 2
                              : kind == pstrain::OptimizerKind::sgd ? 0
                                                                    : 1;
    // Two copies of every tensor: one for each call.
    std::vector<Buffer<>> w, g, state, w2, state2;
    std::vector<pstrain::OptimizerTensor> tensors;
    for (std::size_t n : sizes) {
      const auto wv = random_vector(n + 1, rng), gv = random_vector(n + 1, rng);
      const auto sv = random_vector(n * slots + 1, rng, 0, 1);
      w.emplace_back(*b, wv), w2.emplace_back(*b, wv), g.emplace_back(*b, gv);
      state.emplace_back(*b, sv), state2.emplace_back(*b, sv);
      tensors.push_back(
          {w.back().data(), g.back().data(), slots ? state.back().data() : nullptr, n});
    }
    for (std::uint64_t step = 1; step <= 2; ++step) {
      b->apply_optimizers(c, tensors, step, 0.5f);
      for (std::size_t t = 0; t < sizes.size(); ++t)
        b->apply_optimizer(c, w2[t].data(), g[t].data(), slots ? state2[t].data() : nullptr,
                           sizes[t], step, 0.5f);
    }
    INFO("optimizer " << int(kind));
    // The element past each tensor's end stays as it was.
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      INFO("tensor " << t << " of " << sizes[t]);
      REQUIRE(w[t].read() == w2[t].read());
      REQUIRE(state[t].read() == state2[t].read());
    }
  }
}

}  // namespace
