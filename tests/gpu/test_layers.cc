// The CUDA backend's layers against the double reference: dense, relu,
// conv2d (cuDNN and im2col), maxpool, softmax and binary cross-entropy, the
// dot interaction, embedding lookups, and an MLP trained from backend calls
// alone.
#include "tests/gpu/gpu_support.h"

using namespace pstrain::gpu_test;

namespace {

TEST_CASE("backend: name and errors") {
  auto b = make_backend();
  CHECK(b->name().rfind("cuda:0 (", 0) == 0);
  CHECK_FALSE(b->host_accessible());
  std::array<char, 512> error{};
  CHECK(pstrain_cuda_create_backend(999, error.data(), error.size()) == nullptr);
  CHECK(std::string(error.data()).find("device 999 does not exist") != std::string::npos);
  Buffer<float> small(*b, 4);
  std::vector<float> host(8);
  CHECK_THROWS_WITH_AS(b->upload(host.data(), small.data(), 32),
                       doctest::Contains("overrun an allocation of 16 bytes"),
                       std::invalid_argument);
  CHECK_THROWS_AS(b->dense_forward(small.data(), small.data(), small.data(), small.data(), 0, 1, 1),
                  std::invalid_argument);
  CHECK_THROWS_AS(b->wait(b->fence() + 5), std::invalid_argument);
}

TEST_CASE("dense forward and backward match the reference") {
  auto b = make_backend();
  std::mt19937 rng(1);
  for (auto [n, in, out] : {std::array{1, 1, 1}, std::array{3, 5, 7}, std::array{33, 17, 10},
                            std::array{64, 784, 128}, std::array{256, 128, 10}}) {
    INFO("n=" << n << " in=" << in << " out=" << out);
    const auto x = random_vector(std::size_t(n) * in, rng);
    const auto w = random_vector(std::size_t(in) * out, rng);
    const auto bias = random_vector(out, rng);
    const auto dy = random_vector(std::size_t(n) * out, rng);
    Buffer<> dx_(*b, x), dw_(*b, w), db_(*b, bias), ddy(*b, dy);
    Buffer<> y(*b, std::size_t(n) * out), dx(*b, x.size()), dw(*b, w.size()), db(*b, out);
    b->dense_forward(dx_.data(), dw_.data(), db_.data(), y.data(), n, in, out);
    std::vector<double> ry(y.size);
    ref::dense_forward(widen(x).data(), widen(w).data(), widen(bias).data(), ry.data(), n, in, out);
    check_close(y.read(), ry, "dense y");

    std::vector<double> rdx(x.size()), rdw(w.size()), rdb(out);
    ref::dense_backward(widen(x).data(), widen(w).data(), widen(dy).data(), rdx.data(), rdw.data(),
                        rdb.data(), n, in, out);
    b->fill(dw.data(), 123.0f, dw.size);  // overwritten, not accumulated
    b->dense_backward(dx_.data(), dw_.data(), ddy.data(), dx.data(), dw.data(), db.data(), n, in,
                      out);
    check_close(dx.read(), rdx, "dense dx");
    check_close(dw.read(), rdw, "dense dw");
    check_close(db.read(), rdb, "dense db");
    b->dense_backward(dx_.data(), dw_.data(), ddy.data(), nullptr, dw.data(), db.data(), n, in,
                      out);
    check_close(dw.read(), rdw, "dense dw without dx");

    // Operands one float past 16-byte alignment take the unfused path
    // (cuBLASLt's epilogues need aligned pointers): the same results.
    std::vector<float> shifted_x(x.size() + 1);
    std::copy(x.begin(), x.end(), shifted_x.begin() + 1);
    Buffer<> sx(*b, shifted_x), sy(*b, y.size + 1), sdw(*b, w.size() + 1);
    b->dense_forward(sx.data() + 1, dw_.data(), db_.data(), sy.data() + 1, n, in, out);
    auto got = sy.read();
    check_close({got.begin() + 1, got.end()}, ry, "dense y, unaligned");
    b->dense_backward(sx.data() + 1, dw_.data(), ddy.data(), nullptr, sdw.data() + 1, db.data(), n,
                      in, out);
    got = sdw.read();
    check_close({got.begin() + 1, got.end()}, rdw, "dense dw, unaligned");
    check_close(db.read(), rdb, "dense db, unaligned");
  }
}

TEST_CASE("all_finite finds a NaN or an infinity anywhere, after the work that wrote it") {
  auto b = make_backend();
  const std::size_t n = 1 << 20;
  Buffer<> x(*b, std::vector<float>(n, 1.0f));
  CHECK(b->all_finite(x.data(), n));
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    auto host = host_filled(*b, 1, bad);
    ComputeHold hold(*b);
    b->scale(x.data(), 2.0f, n);  // held: all_finite must look after it
    b->upload(host.data(), x.data() + 777777, sizeof(float));
    hold.release();
    CHECK_FALSE(b->all_finite(x.data(), n));
    CHECK(b->all_finite(x.data(), 777777));  // the elements before it
    b->fill(x.data(), 1.0f, n);
  }
}

TEST_CASE("relu forward and backward match the reference") {
  auto b = make_backend();
  std::mt19937 rng(2);
  auto x = random_vector(1000, rng);
  x[0] = 0.0f;
  const auto dy = random_vector(x.size(), rng);
  Buffer<> bx(*b, x), bdy(*b, dy), y(*b, x.size()), dx(*b, x.size());
  b->relu_forward(bx.data(), y.data(), x.size());
  std::vector<double> ry(x.size()), rdx(x.size());
  ref::relu_forward(widen(x).data(), ry.data(), x.size());
  const auto gy = y.read();
  check_close(gy, ry, "relu y");
  b->relu_backward(y.data(), bdy.data(), dx.data(), x.size());
  ref::relu_backward(ry.data(), widen(dy).data(), rdx.data(), x.size());
  check_close(dx.read(), rdx, "relu dx");
}

TEST_CASE("conv2d forward and backward match the reference, cuDNN and im2col") {
  for (bool cudnn : {true, false}) {
    INFO("cudnn " << cudnn);
    auto b = make_conv_backend(cudnn);
    std::mt19937 rng(3);
    // The last two shapes exceed one im2col chunk, so several chunks run.
    for (ConvShape s :
         {ConvShape{2, 1, 5, 5, 3, 3}, ConvShape{3, 4, 8, 7, 5, 3}, ConvShape{2, 2, 6, 6, 2, 1},
          ConvShape{5, 3, 10, 10, 8, 5}, ConvShape{16, 1, 28, 28, 32, 3},
          ConvShape{8, 1, 512, 512, 8, 1}, ConvShape{7, 2, 300, 300, 16, 3}}) {
      INFO("n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w << " filters=" << s.filters
                << " kernel=" << s.kernel);
      const std::size_t xn = std::size_t(s.n) * s.c * s.h * s.w;
      const std::size_t wn = std::size_t(s.filters) * s.c * s.kernel * s.kernel;
      const std::size_t yn = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
      const auto x = random_vector(xn, rng), w = random_vector(wn, rng);
      const auto bias = random_vector(s.filters, rng), dy = random_vector(yn, rng);
      Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), bdy(*b, dy);
      Buffer<> y(*b, yn), dx(*b, xn), dw(*b, wn), db(*b, s.filters);
      Buffer<> workspace(*b, b->conv2d_workspace(s));
      b->conv2d_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(), nullptr, s);
      std::vector<double> ry(yn), rdx(xn), rdw(wn), rdb(s.filters);
      ref::conv2d_forward(widen(x).data(), widen(w).data(), widen(bias).data(), ry.data(), s);
      check_close(y.read(), ry, "conv y");
      // The relu in the epilogue; y holding the plain output must not matter.
      b->conv2d_relu_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(), nullptr,
                             s);
      std::vector<double> relu_y = ry;
      for (double& v : relu_y) v = std::max(v, 0.0);
      check_close(y.read(), relu_y, "conv relu y");
      ref::conv2d_backward(widen(x).data(), widen(w).data(), widen(dy).data(), rdx.data(),
                           rdw.data(), rdb.data(), s);
      b->fill(dw.data(), 7.0f, wn);
      b->conv2d_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(),
                         workspace.data(), nullptr, s);
      check_close(dx.read(), rdx, "conv dx");
      check_close(dw.read(), rdw, "conv dw");
      check_close(db.read(), rdb, "conv db");
      b->conv2d_backward(bx.data(), bw.data(), bdy.data(), nullptr, dw.data(), db.data(),
                         workspace.data(), nullptr, s);
      check_close(dw.read(), rdw, "conv dw without dx");
      // Deterministic algorithms: the same inputs give the same bits.
      const auto first = dw.read();
      b->conv2d_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(),
                         workspace.data(), nullptr, s);
      CHECK(dw.read() == first);
    }
    CHECK_THROWS_AS(b->conv2d_workspace(ConvShape{1, 1, 2, 2, 1, 3}), std::invalid_argument);
    // The path that ran is the one asked for: where cuDNN is usable here,
    // a backend that silently took im2col would pass every check above.
    const pstrain::PathCounts paths = b->path_counts();
    INFO("paths: " << describe(paths));
    if (cudnn && cudnn_usable()) {
      CHECK(paths.count("conv2d cudnn") == 1);
      CHECK(paths.count("conv2d im2col") == 0);
      CHECK(paths.count("conv2d cudnn unsupported") == 0);
    } else {
      CHECK(paths.count("conv2d cudnn") == 0);
      CHECK(paths.count("conv2d im2col") == 1);
    }
  }
}

TEST_CASE("maxpool forward and backward match the reference, ties included") {
  auto b = make_backend();
  std::mt19937 rng(4);
  for (PoolShape s :
       {PoolShape{2, 3, 8, 8, 2}, PoolShape{3, 2, 7, 9, 2}, PoolShape{1, 4, 10, 11, 3}}) {
    const std::size_t xn = std::size_t(s.n) * s.c * s.h * s.w;
    const std::size_t yn = std::size_t(s.n) * s.c * s.out_h() * s.out_w();
    // Few distinct values, so windows hold ties the first-element rule decides.
    std::vector<float> x(xn);
    std::uniform_int_distribution<int> level(0, 3);
    for (auto& v : x) v = float(level(rng));
    const auto dy = random_vector(yn, rng);
    Buffer<> bx(*b, x), bdy(*b, dy), y(*b, yn), dx(*b, xn);
    Buffer<std::int32_t> argmax(*b, yn);
    b->maxpool_forward(bx.data(), y.data(), argmax.data(), s);
    std::vector<double> ry(yn), rdx(xn);
    std::vector<std::int32_t> rarg(yn);
    ref::maxpool_forward(widen(x).data(), ry.data(), rarg.data(), s);
    check_close(y.read(), ry, "maxpool y");
    const auto got_arg = argmax.read();
    const auto mismatch = std::mismatch(got_arg.begin(), got_arg.end(), rarg.begin());
    if (mismatch.first != got_arg.end()) {
      FAIL_CHECK("argmax " << (mismatch.first - got_arg.begin()) << " is " << *mismatch.first
                           << " (x " << x.at(*mismatch.first) << "), want " << *mismatch.second
                           << " (x " << x.at(*mismatch.second) << ")");
    }
    b->fill(dx.data(), 5.0f, xn);  // overwritten, remainder rows and columns too
    b->maxpool_backward(bdy.data(), argmax.data(), dx.data(), s);
    ref::maxpool_backward(widen(dy).data(), rarg.data(), rdx.data(), s);
    check_close(dx.read(), rdx, "maxpool dx");
  }
}

TEST_CASE("maxpool ties go to the first element of the window") {
  auto b = make_backend();
  const PoolShape s{1, 1, 2, 4, 2};
  Buffer<> x(*b, std::vector<float>{3, 3, 1, 2, 3, 0, 2, 1}), y(*b, 2), dx(*b, 8);
  Buffer<std::int32_t> argmax(*b, 2);
  b->maxpool_forward(x.data(), y.data(), argmax.data(), s);
  CHECK(x.read() == std::vector<float>{3, 3, 1, 2, 3, 0, 2, 1});
  CHECK(y.read() == std::vector<float>{3, 2});
  const auto got = argmax.read();
  const std::vector<std::int32_t> want{0, 3};
  CHECK_MESSAGE(got == want, "argmax " << got[0] << ", " << got[1]);
}

TEST_CASE("softmax cross-entropy matches the reference") {
  auto b = make_backend();
  std::mt19937 rng(5);
  for (auto [n, classes] : {std::array{1, 1}, std::array{5, 10}, std::array{100, 10},
                            std::array{7, 37}, std::array{3, 100}}) {
    INFO("n=" << n << " classes=" << classes);
    auto logits = random_vector(std::size_t(n) * classes, rng, -8, 8);
    if (classes > 3) logits[2] = logits[1] = 20.0f;  // a tie: the first maximum counts
    std::vector<std::int32_t> labels(n);
    std::uniform_int_distribution<int> pick(0, classes - 1);
    for (auto& l : labels) l = pick(rng);
    labels[0] = classes > 3 ? 1 : 0;
    Buffer<> bl(*b, logits), dl(*b, logits.size()), loss(*b, n), correct(*b, n);
    Buffer<std::int32_t> blabels(*b, labels);
    b->softmax_xent(bl.data(), blabels.data(), dl.data(), loss.data(), correct.data(), n, classes);
    std::vector<double> rdl(logits.size()), rloss(n), rcorrect(n);
    ref::softmax_xent(widen(logits).data(), labels.data(), rdl.data(), rloss.data(),
                      rcorrect.data(), n, classes);
    check_close(dl.read(), rdl, "dlogits");
    check_close(loss.read(), rloss, "loss");
    check_close(correct.read(), rcorrect, "correct", 0);
  }
}

TEST_CASE("binary cross-entropy and the dot interaction match the reference") {
  auto b = make_backend();
  std::mt19937 rng(6);
  const int n = 1000;
  auto logits = random_vector(n, rng, -30, 30);
  logits[0] = 90.0f;   // confidently right, and
  logits[1] = -90.0f;  // confidently wrong: finite either way
  std::vector<std::int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = static_cast<std::int32_t>(rng() % 2);
  labels[0] = labels[1] = 1;
  Buffer<> bl(*b, logits), dl(*b, n), loss(*b, n), correct(*b, n);
  Buffer<std::int32_t> blabels(*b, labels);
  b->bce_logits(bl.data(), blabels.data(), dl.data(), loss.data(), correct.data(), n);
  std::vector<double> rdl(n), rloss(n), rcorrect(n);
  ref::bce_logits(widen(logits).data(), labels.data(), rdl.data(), rloss.data(), rcorrect.data(),
                  n);
  check_close(dl.read(), rdl, "dlogits");
  check_close(loss.read(), rloss, "loss");
  check_close(correct.read(), rcorrect, "correct", 0);

  for (const pstrain::InteractionShape s :
       {pstrain::InteractionShape{300, 27, 16, 16}, pstrain::InteractionShape{7, 3, 5, 0}}) {
    INFO("vectors=" << s.vectors << " dim=" << s.dim);
    const auto x = random_vector(std::size_t(s.n) * s.in_width(), rng);
    const auto dy = random_vector(std::size_t(s.n) * s.out_width(), rng);
    Buffer<> bx(*b, x), bdy(*b, dy), by(*b, dy.size()), bdx(*b, x.size());
    b->dot_interaction_forward(bx.data(), by.data(), s);
    b->dot_interaction_backward(bx.data(), bdy.data(), bdx.data(), s);
    std::vector<double> ry(dy.size()), rdx(x.size());
    ref::dot_interaction_forward(widen(x).data(), ry.data(), s);
    ref::dot_interaction_backward(widen(x).data(), widen(dy).data(), rdx.data(), s);
    check_close(by.read(), ry, "interaction");
    check_close(bdx.read(), rdx, "interaction dx");
  }
}

// Backend::conv2d_columns on the im2col path: backward reading the matrix
// forward kept gives the bits of backward computing it again, at fp32 and
// the low precisions, in chunks, after the relu-fused forward, twice in a
// row, and without dx; the workspace is poisoned in between and the buffer
// first holds another batch's matrix. cuDNN keeps none.
TEST_CASE("conv2d backward from the columns kept by forward equals backward recomputing them") {
  if (auto cudnn = make_conv_backend(true);
      cudnn->name().find("im2col convolutions") == std::string::npos)
    CHECK(cudnn->conv2d_columns(ConvShape{3, 4, 8, 7, 5, 3}) == 0);
  auto b = make_conv_backend(false);
  std::mt19937 rng(13);
  std::vector<pstrain::Precision> precisions{pstrain::Precision::fp32};
  for (const auto [precision, format] : kLowPrecisions)
    if (computes_at(*b, precision)) precisions.push_back(precision);
  for (const pstrain::Precision p : precisions) {
    b->set_precision(p);
    // The last shape takes two im2col chunks.
    for (ConvShape s : {ConvShape{3, 4, 8, 7, 5, 3}, ConvShape{16, 1, 28, 28, 32, 3},
                        ConvShape{7, 2, 300, 300, 16, 3}}) {
      INFO(to_string(p) << " n=" << s.n << " c=" << s.c << " h=" << s.h
                        << " filters=" << s.filters);
      const std::size_t xn = std::size_t(s.n) * s.c * s.h * s.w;
      const std::size_t wn = std::size_t(s.filters) * s.c * s.kernel * s.kernel;
      const std::size_t yn = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
      REQUIRE(b->conv2d_columns(s) == wn / s.filters * s.out_h() * s.out_w() * s.n);
      const auto x = random_vector(xn, rng), other = random_vector(xn, rng);
      const auto w = random_vector(wn, rng), bias = random_vector(s.filters, rng),
                 dy = random_vector(yn, rng);
      Buffer<> bx(*b, x), bother(*b, other), bw(*b, w), bb(*b, bias), bdy(*b, dy);
      Buffer<> y(*b, yn), dx(*b, xn), dw(*b, wn), db(*b, s.filters);
      Buffer<> workspace(*b, b->conv2d_workspace(s)), columns(*b, b->conv2d_columns(s));
      b->conv2d_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(), nullptr, s);
      b->conv2d_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(),
                         workspace.data(), nullptr, s);
      const auto y_ref = y.read(), dx_ref = dx.read(), dw_ref = dw.read(), db_ref = db.read();
      b->conv2d_forward(bother.data(), bw.data(), bb.data(), y.data(), workspace.data(),
                        columns.data(), s);
      for (const bool relu : {false, true}) {
        INFO("relu " << relu);
        if (relu) {
          b->conv2d_relu_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(),
                                 columns.data(), s);
          std::vector<float> relu_ref = y_ref;
          for (float& v : relu_ref) v = std::max(v, 0.0f);
          CHECK(y.read() == relu_ref);
        } else {
          b->conv2d_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(),
                            columns.data(), s);
          CHECK(y.read() == y_ref);
        }
        for (int call = 0; call < 2; ++call) {
          INFO("call " << call);
          b->fill(workspace.data(), std::nanf(""), workspace.size);
          b->fill(dx.data(), 7.0f, xn);
          b->conv2d_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(),
                             workspace.data(), columns.data(), s);
          CHECK(dx.read() == dx_ref);
          CHECK(dw.read() == dw_ref);
          CHECK(db.read() == db_ref);
        }
        b->fill(dw.data(), 7.0f, wn);
        b->conv2d_backward(bx.data(), bw.data(), bdy.data(), nullptr, dw.data(), db.data(),
                           workspace.data(), columns.data(), s);
        CHECK(dw.read() == dw_ref);
      }
    }
    b->set_precision(pstrain::Precision::fp32);
  }
}

TEST_CASE("an MLP trained on the GPU from backend calls alone learns") {
  auto b = make_backend();
  std::mt19937 rng(8);
  const int n = 128, in = 20, hidden = 32, classes = 3;
  // Three Gaussian blobs, one per class.
  const auto centers = random_vector(classes * in, rng, -2, 2);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  std::vector<float> x(n * in);
  std::vector<std::int32_t> labels(n);
  for (int i = 0; i < n; ++i) {
    labels[i] = i % classes;
    for (int k = 0; k < in; ++k) x[i * in + k] = centers[labels[i] * in + k] + noise(rng);
  }
  Buffer<> bx(*b, x), w1(*b, random_vector(in * hidden, rng, -0.3f, 0.3f)), b1(*b, hidden);
  Buffer<> w2(*b, random_vector(hidden * classes, rng, -0.3f, 0.3f)), b2(*b, classes);
  Buffer<std::int32_t> bl(*b, labels);
  Buffer<> h(*b, n * hidden), a(*b, n * hidden), logits(*b, n * classes), dlogits(*b, n * classes);
  Buffer<> loss(*b, n), correct(*b, n), da(*b, n * hidden), dh(*b, n * hidden);
  Buffer<> dw1(*b, in * hidden), db1(*b, hidden), dw2(*b, hidden * classes), db2(*b, classes);
  b->fill(b1.data(), 0, hidden);
  b->fill(b2.data(), 0, classes);
  pstrain::OptimizerConfig sgd;
  sgd.lr = 0.1f;
  auto mean_loss = [&] {
    const auto l = loss.read();
    double s = 0;
    for (float v : l) s += v;
    return s / n;
  };
  double first = 0;
  for (int step = 1; step <= 100; ++step) {
    b->dense_forward(bx.data(), w1.data(), b1.data(), h.data(), n, in, hidden);
    b->relu_forward(h.data(), a.data(), n * hidden);
    b->dense_forward(a.data(), w2.data(), b2.data(), logits.data(), n, hidden, classes);
    b->softmax_xent(logits.data(), bl.data(), dlogits.data(), loss.data(), correct.data(), n,
                    classes);
    if (step == 1) first = mean_loss();
    b->dense_backward(a.data(), w2.data(), dlogits.data(), da.data(), dw2.data(), db2.data(), n,
                      hidden, classes);
    b->relu_backward(a.data(), da.data(), dh.data(), n * hidden);
    b->dense_backward(bx.data(), w1.data(), dh.data(), nullptr, dw1.data(), db1.data(), n, in,
                      hidden);
    for (auto [w, g, size] :
         {std::tuple{w1.data(), dw1.data(), w1.size}, std::tuple{b1.data(), db1.data(), b1.size},
          std::tuple{w2.data(), dw2.data(), w2.size}, std::tuple{b2.data(), db2.data(), b2.size}}) {
      b->apply_optimizer(sgd, w, g, nullptr, size, step, 1.0f);
    }
  }
  const double last = mean_loss();
  const auto c = correct.read();
  const double accuracy = std::count(c.begin(), c.end(), 1.0f) / double(n);
  MESSAGE("loss " << first << " -> " << last << ", accuracy " << accuracy);
  CHECK(last < 0.2 * first);
  CHECK(accuracy > 0.95);
}

TEST_CASE("embedding lookups and segment sums give the CPU's bits") {
  auto b = make_backend();
  std::mt19937 rng(3);
  struct Case {
    bool bag, mean;
    int k, stride_extra;
  };
  for (const Case c : {Case{true, false, 3, 5}, Case{true, true, 4, 0}, Case{false, false, 3, 2},
                       Case{false, false, 1, 0}}) {
    const bool bag = c.bag, mean = c.mean;
    const int k = c.k, stride_extra = c.stride_extra;
    INFO("bag=" << bag << " mean=" << mean << " k=" << k);
    const int n = 300, dim = 33, unique = 70;
    const pstrain::EmbeddingShape s{n,      k,   dim, (bag ? dim : k * dim) + stride_extra,
                                    unique, bag, mean};
    std::vector<std::int32_t> inverse(std::size_t(n) * k);
    for (auto& v : inverse) v = static_cast<std::int32_t>(rng() % unique);
    for (int u = 0; u < unique; ++u) inverse[std::size_t(u)] = u;
    const auto rows = random_vector(std::size_t(unique) * dim, rng);
    const auto dout = random_vector(std::size_t(n) * s.stride, rng);
    std::vector<std::int32_t> by_row, offsets;
    ref::occurrences_by_row(inverse, unique, by_row, offsets);
    Buffer<> d_rows(*b, rows), d_dout(*b, dout), d_out(*b, std::size_t(n) * s.stride),
        d_drows(*b, std::size_t(unique) * dim);
    Buffer<std::int32_t> d_inverse(*b, inverse), d_by_row(*b, by_row), d_offsets(*b, offsets);
    b->fill(d_out.data(), 7.0f, d_out.size);
    b->embedding_forward(d_rows.data(), d_inverse.data(), d_out.data(), s);
    std::vector<float> want(std::size_t(n) * s.stride, 7.0f);
    ref::embedding_forward(rows.data(), inverse.data(), want.data(), s);
    CHECK(d_out.read() == want);
    b->embedding_backward(d_dout.data(), d_by_row.data(), d_offsets.data(), d_drows.data(), s);
    std::vector<float> want_drows(std::size_t(unique) * dim);
    ref::embedding_backward(dout.data(), inverse.data(), want_drows.data(), s);
    CHECK(d_drows.read() == want_drows);
  }
}

}  // namespace
