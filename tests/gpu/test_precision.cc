// bf16 and fp16 GEMMs, convolutions and a training step of the CUDA
// backend against the reference on rounded operands.
#include "tests/gpu/gpu_support.h"

using namespace pstrain::gpu_test;

namespace {

TEST_CASE("bf16 and fp16 dense GEMMs equal the reference on rounded operands") {
  auto b = make_backend();
  std::mt19937 rng(11);
  for (const auto [precision, format] : kLowPrecisions) {
    if (!computes_at(*b, precision)) continue;
    b->set_precision(precision);
    for (auto [n, in, out] : {std::array{33, 17, 10}, std::array{64, 784, 128},
                              std::array{256, 128, 10}, std::array{1024, 784, 256}}) {
      INFO(to_string(precision) << " n=" << n << " in=" << in << " out=" << out);
      const auto x = random_vector(std::size_t(n) * in, rng);
      const auto w = random_vector(std::size_t(in) * out, rng);
      const auto bias = random_vector(out, rng);
      const auto dy = random_vector(std::size_t(n) * out, rng);
      Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), bdy(*b, dy);
      Buffer<> y(*b, std::size_t(n) * out), dx(*b, x.size()), dw(*b, w.size()), db(*b, out);
      b->dense_forward(bx.data(), bw.data(), bb.data(), y.data(), n, in, out);
      const auto rx = rounded(x, format), rw = rounded(w, format), rdy = rounded(dy, format);
      std::vector<double> ry(y.size), rdx(x.size()), rdw(w.size()), rdb(out);
      ref::dense_forward(rx.data(), rw.data(), widen(bias).data(), ry.data(), n, in, out);
      check_close(y.read(), ry, "dense y", kLowPrecisionTolerance);
      b->dense_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(), n, in,
                        out);
      ref::dense_backward(rx.data(), rw.data(), rdy.data(), rdx.data(), rdw.data(), rdb.data(), n,
                          in, out);
      check_close(dx.read(), rdx, "dense dx", kLowPrecisionTolerance);
      check_close(dw.read(), rdw, "dense dw", kLowPrecisionTolerance);
      // The bias gradient is a float32 sum of dy, not a GEMM.
      std::vector<double> fdx(x.size()), fdw(w.size()), fdb(out);
      ref::dense_backward(widen(x).data(), widen(w).data(), widen(dy).data(), fdx.data(),
                          fdw.data(), fdb.data(), n, in, out);
      check_close(db.read(), fdb, "dense db");
    }
    b->set_precision(pstrain::Precision::fp32);
  }
}

TEST_CASE("bf16 and fp16 convolutions equal the reference on rounded operands") {
  auto b = make_backend();
  std::mt19937 rng(12);
  for (const auto [precision, format] : kLowPrecisions) {
    if (!computes_at(*b, precision)) continue;
    b->set_precision(precision);
    for (ConvShape s : {ConvShape{3, 4, 8, 7, 5, 3}, ConvShape{16, 1, 28, 28, 32, 3},
                        ConvShape{16, 32, 13, 13, 64, 3}}) {
      INFO(to_string(precision) << " n=" << s.n << " c=" << s.c << " filters=" << s.filters);
      const std::size_t xn = std::size_t(s.n) * s.c * s.h * s.w;
      const std::size_t wn = std::size_t(s.filters) * s.c * s.kernel * s.kernel;
      const std::size_t yn = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
      const auto x = random_vector(xn, rng), w = random_vector(wn, rng);
      const auto bias = random_vector(s.filters, rng), dy = random_vector(yn, rng);
      Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), bdy(*b, dy);
      Buffer<> y(*b, yn), dx(*b, xn), dw(*b, wn), db(*b, s.filters);
      Buffer<> workspace(*b, b->conv2d_workspace(s));
      b->conv2d_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(), nullptr, s);
      b->conv2d_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(),
                         workspace.data(), nullptr, s);
      const auto rx = rounded(x, format), rw = rounded(w, format), rdy = rounded(dy, format);
      std::vector<double> ry(yn), rdx(xn), rdw(wn), rdb(s.filters);
      ref::conv2d_forward(rx.data(), rw.data(), widen(bias).data(), ry.data(), s);
      ref::conv2d_backward(rx.data(), rw.data(), rdy.data(), rdx.data(), rdw.data(), rdb.data(), s);
      check_close(y.read(), ry, "conv y", kLowPrecisionTolerance);
      check_close(dx.read(), rdx, "conv dx", kLowPrecisionTolerance);
      check_close(dw.read(), rdw, "conv dw", kLowPrecisionTolerance);
    }
    b->set_precision(pstrain::Precision::fp32);
  }
}

TEST_CASE("a bf16 and fp16 training step equals the reference step on rounded operands") {
  // Dense forward, softmax cross-entropy, dense backward, SGD: the GEMMs'
  // operands rounded (the loss gradient too, as the backward GEMM reads
  // it), everything else float32, the weights float32 masters.
  auto b = make_backend();
  std::mt19937 rng(13);
  constexpr int kN = 256, kIn = 784, kClasses = 10;
  const auto x = random_vector(std::size_t(kN) * kIn, rng);
  const auto w = random_vector(std::size_t(kIn) * kClasses, rng, -0.05f, 0.05f);
  const std::vector<float> bias(kClasses, 0.0f);
  std::vector<std::int32_t> labels(kN);
  for (int i = 0; i < kN; ++i) labels[i] = i % kClasses;
  pstrain::OptimizerConfig sgd;
  sgd.kind = pstrain::OptimizerKind::sgd;
  sgd.lr = 0.5f;
  for (const auto [precision, format] : kLowPrecisions) {
    if (!computes_at(*b, precision)) continue;
    INFO(to_string(precision));
    b->set_precision(precision);
    Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), logits(*b, std::size_t(kN) * kClasses);
    Buffer<> dlogits(*b, logits.size), loss(*b, kN), correct(*b, kN);
    Buffer<> dw(*b, w.size()), db(*b, kClasses);
    Buffer<std::int32_t> blabels(*b, labels);
    b->dense_forward(bx.data(), bw.data(), bb.data(), logits.data(), kN, kIn, kClasses);
    b->softmax_xent(logits.data(), blabels.data(), dlogits.data(), loss.data(), correct.data(), kN,
                    kClasses);
    b->dense_backward(bx.data(), bw.data(), dlogits.data(), nullptr, dw.data(), db.data(), kN, kIn,
                      kClasses);
    b->apply_optimizer(sgd, bw.data(), dw.data(), nullptr, w.size(), 1, 1.0f);

    const auto rx = rounded(x, format), rw = rounded(w, format);
    std::vector<double> rlogits(logits.size), rdlogits(logits.size), rloss(kN), rcorrect(kN);
    ref::dense_forward(rx.data(), rw.data(), widen(bias).data(), rlogits.data(), kN, kIn, kClasses);
    ref::softmax_xent(rlogits.data(), labels.data(), rdlogits.data(), rloss.data(), rcorrect.data(),
                      kN, kClasses);
    std::vector<double> rdx(x.size()), rdw(w.size()), rdb(kClasses);
    ref::dense_backward(rx.data(), rw.data(), rounded(rdlogits, format).data(), rdx.data(),
                        rdw.data(), rdb.data(), kN, kIn, kClasses);
    std::vector<double> want(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) want[i] = w[i] - sgd.lr * rdw[i];
    check_close(bw.read(), want, "weights after the step", kLowPrecisionTolerance);
    b->set_precision(pstrain::Precision::fp32);
  }
}

}  // namespace
