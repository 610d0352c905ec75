// Every CPU backend operation against the double-precision reference, and
// finite-difference gradient checks of every layer: in double on the
// reference (the reference's backward is the derivative of its forward) and
// in float on the CPU backend, with each of its kernel libraries.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/compute/elementwise.h"
#include "tests/support/reference_layers.h"

using namespace pstrain;

namespace {

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// |got - want| <= tol * (1 + |want|) for every element, reporting the first
// offender.
void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > tol * (1.0 + std::abs(want[i]))) {
      FAIL_CHECK(what << "[" << i << "]: got " << got[i] << ", want " << want[i]);
      return;
    }
  }
}

// The two implementations the gradient checks run on.
struct ReferenceOps {
  using T = double;
  void dense_forward(const T* x, const T* w, const T* b, T* y, int n, int in, int out) {
    reference::dense_forward(x, w, b, y, n, in, out);
  }
  void dense_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int n, int in,
                      int out) {
    reference::dense_backward(x, w, dy, dx, dw, db, n, in, out);
  }
  void conv2d_forward(const T* x, const T* w, const T* b, T* y, const ConvShape& s) {
    reference::conv2d_forward(x, w, b, y, s);
  }
  void conv2d_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db,
                       const ConvShape& s) {
    reference::conv2d_backward(x, w, dy, dx, dw, db, s);
  }
  void relu_forward(const T* x, T* y, std::size_t n) { reference::relu_forward(x, y, n); }
  void relu_backward(const T* y, const T* dy, T* dx, std::size_t n) {
    reference::relu_backward(y, dy, dx, n);
  }
  void maxpool_forward(const T* x, T* y, std::int32_t* argmax, const PoolShape& s) {
    reference::maxpool_forward(x, y, argmax, s);
  }
  void maxpool_backward(const T* dy, const std::int32_t* argmax, T* dx, const PoolShape& s) {
    reference::maxpool_backward(dy, argmax, dx, s);
  }
  void softmax_xent(const T* logits, const std::int32_t* labels, T* dlogits, T* loss, T* correct,
                    int n, int classes) {
    reference::softmax_xent(logits, labels, dlogits, loss, correct, n, classes);
  }
};

struct CpuOps {
  using T = float;
  // Relu, pooling and the loss do not depend on the kernel library.
  explicit CpuOps(CpuKernels kernels = CpuKernels::onednn)
      : backend(make_cpu_backend(1, kernels)) {}
  std::unique_ptr<Backend> backend;
  std::vector<float> workspace;

  void dense_forward(const T* x, const T* w, const T* b, T* y, int n, int in, int out) {
    backend->dense_forward(x, w, b, y, n, in, out);
  }
  void dense_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int n, int in,
                      int out) {
    backend->dense_backward(x, w, dy, dx, dw, db, n, in, out);
  }
  void conv2d_forward(const T* x, const T* w, const T* b, T* y, const ConvShape& s) {
    workspace.resize(backend->conv2d_workspace(s));
    backend->conv2d_forward(x, w, b, y, workspace.data(), nullptr, s);
  }
  void conv2d_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db,
                       const ConvShape& s) {
    workspace.resize(backend->conv2d_workspace(s));
    backend->conv2d_backward(x, w, dy, dx, dw, db, workspace.data(), nullptr, s);
  }
  void relu_forward(const T* x, T* y, std::size_t n) { backend->relu_forward(x, y, n); }
  void relu_backward(const T* y, const T* dy, T* dx, std::size_t n) {
    backend->relu_backward(y, dy, dx, n);
  }
  void maxpool_forward(const T* x, T* y, std::int32_t* argmax, const PoolShape& s) {
    backend->maxpool_forward(x, y, argmax, s);
  }
  void maxpool_backward(const T* dy, const std::int32_t* argmax, T* dx, const PoolShape& s) {
    backend->maxpool_backward(dy, argmax, dx, s);
  }
  void softmax_xent(const T* logits, const std::int32_t* labels, T* dlogits, T* loss, T* correct,
                    int n, int classes) {
    backend->softmax_xent(logits, labels, dlogits, loss, correct, n, classes);
  }
};

// Central differences of `loss` with respect to up to 24 spread-out elements
// of `values`, against the analytic gradient.
template <class T>
void check_gradient(std::vector<T>& values, const std::vector<T>& analytic,
                    const std::function<double()>& loss, T eps, double tol,
                    const std::string& what) {
  REQUIRE(values.size() == analytic.size());
  const std::size_t step = std::max<std::size_t>(1, values.size() / 24);
  for (std::size_t i = 0; i < values.size(); i += step) {
    const T saved = values[i];
    values[i] = saved + eps;
    const double up = loss();
    values[i] = saved - eps;
    const double down = loss();
    values[i] = saved;
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    if (std::abs(numeric - analytic[i]) > tol * (1.0 + std::abs(numeric))) {
      FAIL_CHECK(what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric);
      return;
    }
  }
}

template <class T>
std::vector<T> cast(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// L = sum(y * r) for a fixed random r, so dL/dy = r.
template <class T>
double weighted_sum(const std::vector<T>& y, const std::vector<T>& r) {
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * r[i];
  return sum;
}

template <class Ops>
void gradcheck_layers(Ops& ops, typename Ops::T eps, double tol) {
  using T = typename Ops::T;
  std::mt19937 rng(11);

  {  // dense
    const int n = 3, in = 5, out = 4;
    auto x = cast<T>(random_floats(n * in, rng));
    auto w = cast<T>(random_floats(in * out, rng));
    auto b = cast<T>(random_floats(out, rng));
    const auto r = cast<T>(random_floats(n * out, rng));
    std::vector<T> y(n * out), dx(x.size()), dw(w.size()), db(b.size());
    auto loss = [&] {
      ops.dense_forward(x.data(), w.data(), b.data(), y.data(), n, in, out);
      return weighted_sum(y, r);
    };
    ops.dense_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), n, in, out);
    check_gradient(x, dx, loss, eps, tol, "dense dx");
    check_gradient(w, dw, loss, eps, tol, "dense dw");
    check_gradient(b, db, loss, eps, tol, "dense db");
  }
  {  // conv2d, non-square, several channels
    const ConvShape s{2, 3, 6, 5, 4, 3};
    auto x = cast<T>(random_floats(static_cast<std::size_t>(s.n) * s.c * s.h * s.w, rng));
    auto w = cast<T>(random_floats(static_cast<std::size_t>(s.filters) * s.c * 9, rng));
    auto b = cast<T>(random_floats(s.filters, rng));
    const std::size_t ysize = static_cast<std::size_t>(s.n) * s.filters * s.out_h() * s.out_w();
    const auto r = cast<T>(random_floats(ysize, rng));
    std::vector<T> y(ysize), dx(x.size()), dw(w.size()), db(b.size());
    auto loss = [&] {
      ops.conv2d_forward(x.data(), w.data(), b.data(), y.data(), s);
      return weighted_sum(y, r);
    };
    ops.conv2d_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), s);
    check_gradient(x, dx, loss, eps, tol, "conv dx");
    check_gradient(w, dw, loss, eps, tol, "conv dw");
    check_gradient(b, db, loss, eps, tol, "conv db");
  }
  {  // relu: inputs kept away from the kink at 0
    auto x = cast<T>(random_floats(40, rng));
    for (T& v : x) v = v < 0 ? v - T(0.1) : v + T(0.1);
    const auto r = cast<T>(random_floats(40, rng));
    std::vector<T> y(40), dx(40);
    auto loss = [&] {
      ops.relu_forward(x.data(), y.data(), x.size());
      return weighted_sum(y, r);
    };
    loss();
    ops.relu_backward(y.data(), r.data(), dx.data(), x.size());
    check_gradient(x, dx, loss, eps, tol, "relu dx");
  }
  {  // maxpool: distinct values far apart, so a small step never changes a maximum
    const PoolShape s{2, 2, 5, 7, 2};
    const std::size_t xsize = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    std::vector<T> x(xsize);
    for (std::size_t i = 0; i < xsize; ++i) x[i] = static_cast<T>(i) * T(0.05);
    std::shuffle(x.begin(), x.end(), rng);
    const std::size_t ysize = static_cast<std::size_t>(s.n) * s.c * s.out_h() * s.out_w();
    const auto r = cast<T>(random_floats(ysize, rng));
    std::vector<T> y(ysize), dx(xsize);
    std::vector<std::int32_t> argmax(ysize);
    auto loss = [&] {
      ops.maxpool_forward(x.data(), y.data(), argmax.data(), s);
      return weighted_sum(y, r);
    };
    loss();
    ops.maxpool_backward(r.data(), argmax.data(), dx.data(), s);
    check_gradient(x, dx, loss, eps, tol, "maxpool dx");
  }
  {  // softmax cross-entropy: the mean loss is the function
    const int n = 4, classes = 5;
    auto logits = cast<T>(random_floats(n * classes, rng, -3, 3));
    const std::vector<std::int32_t> labels = {0, 4, 2, 2};
    std::vector<T> dlogits(logits.size()), losses(n), correct(n);
    auto loss = [&] {
      ops.softmax_xent(logits.data(), labels.data(), dlogits.data(), losses.data(), correct.data(),
                       n, classes);
      double sum = 0;
      for (T l : losses) sum += l;
      return sum / n;
    };
    loss();
    const auto analytic = dlogits;
    check_gradient(logits, analytic, loss, eps, tol, "softmax_xent dlogits");
  }
}

}  // namespace

TEST_CASE("gradients: the reference's backward is the derivative of its forward") {
  ReferenceOps ops;
  gradcheck_layers(ops, 1e-6, 1e-6);
}

const CpuKernels kKernels[] = {CpuKernels::onednn, CpuKernels::openblas};

std::string kernels_name(CpuKernels k) { return k == CpuKernels::onednn ? "onednn" : "openblas"; }

TEST_CASE("gradients: the CPU backend's backward matches finite differences in float") {
  for (const CpuKernels kernels : kKernels) {
    CAPTURE(kernels_name(kernels));
    CpuOps ops(kernels);
    gradcheck_layers(ops, 1e-2f, 2e-3);
  }
}

TEST_CASE("cpu dense matches the reference with both libraries") {
  for (const CpuKernels kernels : kKernels) {
    CAPTURE(kernels_name(kernels));
    CpuOps ops(kernels);
    std::mt19937 rng(1);
    struct Case {
      int n, in, out;
    };
    for (const Case c : {Case{1, 1, 1}, Case{7, 13, 5}, Case{64, 784, 33}, Case{3, 2, 129}}) {
      CAPTURE(c.n);
      CAPTURE(c.in);
      CAPTURE(c.out);
      const auto x = random_floats(c.n * c.in, rng), w = random_floats(c.in * c.out, rng),
                 b = random_floats(c.out, rng), dy = random_floats(c.n * c.out, rng);
      std::vector<float> y(c.n * c.out), dx(x.size()), dw(w.size()), db(b.size());
      std::vector<double> ry(y.size()), rdx(dx.size()), rdw(dw.size()), rdb(db.size());
      const auto dx_ = to_double(x), dw_ = to_double(w), db_ = to_double(b), ddy = to_double(dy);
      ops.dense_forward(x.data(), w.data(), b.data(), y.data(), c.n, c.in, c.out);
      reference::dense_forward(dx_.data(), dw_.data(), db_.data(), ry.data(), c.n, c.in, c.out);
      check_close(y, ry, 1e-4, "y");
      std::fill(dw.begin(), dw.end(), 99.0f);  // overwritten, not accumulated
      ops.dense_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), c.n, c.in,
                         c.out);
      reference::dense_backward(dx_.data(), dw_.data(), ddy.data(), rdx.data(), rdw.data(),
                                rdb.data(), c.n, c.in, c.out);
      check_close(dx, rdx, 1e-4, "dx");
      check_close(dw, rdw, 1e-4, "dw");
      check_close(db, rdb, 1e-4, "db");
      // Without dx, the parameter gradients are unchanged.
      std::vector<float> dw2(dw.size()), db2(db.size());
      ops.dense_backward(x.data(), w.data(), dy.data(), nullptr, dw2.data(), db2.data(), c.n, c.in,
                         c.out);
      CHECK(dw2 == dw);
      CHECK(db2 == db);
    }
  }
}

// Both libraries against the double reference, relative to 1 + |want|: y and dx
// to 1e-4 (float sums of at most 144 products); dw and db to 1e-3, since
// they sum over every sample and position (16,200 products for the 50-sample
// shape) and oneDNN's weight gradient, summing them in a long sequence, is
// 1.2e-4 off there. Each shape runs twice: oneDNN reuses the primitives and
// buffers it built for a shape, and the other shapes in between make it keep
// several.
TEST_CASE("cpu conv2d matches the reference with both libraries, im2col chunks, reused shapes") {
  // The last shape needs more than one chunk of the im2col buffer; the
  // others are small and odd.
  const ConvShape shapes[] = {ConvShape{1, 1, 3, 3, 1, 3}, ConvShape{3, 2, 9, 7, 5, 3},
                              ConvShape{2, 3, 6, 11, 4, 1}, ConvShape{5, 1, 28, 28, 8, 5},
                              ConvShape{50, 16, 20, 20, 8, 3}};
  for (const CpuKernels kernels : kKernels) {
    CAPTURE(kernels_name(kernels));
    CpuOps ops(kernels);
    std::mt19937 rng(2);
    for (int round = 0; round < 2; ++round) {
      for (const ConvShape s : shapes) {
        CAPTURE(round);
        CAPTURE(s.n);
        CAPTURE(s.c);
        CAPTURE(s.kernel);
        const std::size_t xs = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
        const std::size_t ws = static_cast<std::size_t>(s.filters) * s.c * s.kernel * s.kernel;
        const std::size_t ys = static_cast<std::size_t>(s.n) * s.filters * s.out_h() * s.out_w();
        const auto x = random_floats(xs, rng), w = random_floats(ws, rng),
                   b = random_floats(s.filters, rng), dy = random_floats(ys, rng);
        std::vector<float> y(ys), dx(xs, 7.0f), dw(ws, 7.0f), db(s.filters, 7.0f);
        std::vector<double> ry(ys), rdx(xs), rdw(ws), rdb(s.filters);
        const auto x_ = to_double(x), w_ = to_double(w), b_ = to_double(b), dy_ = to_double(dy);
        ops.conv2d_forward(x.data(), w.data(), b.data(), y.data(), s);
        reference::conv2d_forward(x_.data(), w_.data(), b_.data(), ry.data(), s);
        check_close(y, ry, 1e-4, "y");
        ops.conv2d_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), s);
        reference::conv2d_backward(x_.data(), w_.data(), dy_.data(), rdx.data(), rdw.data(),
                                   rdb.data(), s);
        check_close(dx, rdx, 1e-4, "dx");
        check_close(dw, rdw, 1e-3, "dw");
        check_close(db, rdb, 1e-3, "db");
        // Without dx, the parameter gradients are unchanged.
        std::vector<float> dw2(ws), db2(s.filters);
        ops.conv2d_backward(x.data(), w.data(), dy.data(), nullptr, dw2.data(), db2.data(), s);
        CHECK(dw2 == dw);
        CHECK(db2 == db);
      }
    }
  }
}

// Backend::conv2d_columns: backward reading the im2col matrix that forward
// kept gives the bits of backward computing it again, at fp32 and bf16 (the
// GEMMs round the kept matrix as they round a fresh one), with the matrix
// in chunks, after the relu-fused forward, twice in a row, and without dx.
// The workspace is poisoned in between, as the next layer's convolution
// would overwrite it, and the buffer first holds another batch's matrix.
TEST_CASE(
    "cpu conv2d: backward from the columns kept by forward equals backward recomputing them") {
  auto backend = make_cpu_backend(1, CpuKernels::openblas);
  // The last shape takes two im2col chunks (42 and 8 samples).
  const ConvShape shapes[] = {ConvShape{1, 1, 3, 3, 1, 3}, ConvShape{3, 2, 9, 7, 5, 3},
                              ConvShape{2, 3, 6, 11, 4, 1}, ConvShape{50, 16, 20, 20, 8, 3}};
  std::mt19937 rng(21);
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    CAPTURE(to_string(p));
    backend->set_precision(p);
    for (const ConvShape s : shapes) {
      CAPTURE(s.n);
      CAPTURE(s.c);
      CAPTURE(s.kernel);
      const std::size_t xs = std::size_t(s.n) * s.c * s.h * s.w;
      const std::size_t ws = std::size_t(s.filters) * s.c * s.kernel * s.kernel;
      const std::size_t ys = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
      REQUIRE(backend->conv2d_columns(s) == ws / s.filters * s.out_h() * s.out_w() * s.n);
      const auto x = random_floats(xs, rng), other = random_floats(xs, rng),
                 w = random_floats(ws, rng), b = random_floats(s.filters, rng),
                 dy = random_floats(ys, rng);
      std::vector<float> workspace(backend->conv2d_workspace(s));
      std::vector<float> columns(backend->conv2d_columns(s));
      std::vector<float> y_ref(ys), dx_ref(xs), dw_ref(ws), db_ref(s.filters);
      backend->conv2d_forward(x.data(), w.data(), b.data(), y_ref.data(), workspace.data(), nullptr,
                              s);
      backend->conv2d_backward(x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                               db_ref.data(), workspace.data(), nullptr, s);

      std::vector<float> y(ys), dx(xs), dw(ws), db(s.filters);
      backend->conv2d_forward(other.data(), w.data(), b.data(), y.data(), workspace.data(),
                              columns.data(), s);
      for (const bool relu : {false, true}) {
        CAPTURE(relu);
        if (relu) {
          backend->conv2d_relu_forward(x.data(), w.data(), b.data(), y.data(), workspace.data(),
                                       columns.data(), s);
          std::vector<float> relu_ref = y_ref;
          backend->relu_forward(relu_ref.data(), relu_ref.data(), ys);
          CHECK(y == relu_ref);
        } else {
          backend->conv2d_forward(x.data(), w.data(), b.data(), y.data(), workspace.data(),
                                  columns.data(), s);
          CHECK(y == y_ref);
        }
        for (int call = 0; call < 2; ++call) {
          CAPTURE(call);
          std::fill(workspace.begin(), workspace.end(), std::nanf(""));
          std::fill(dx.begin(), dx.end(), 7.0f);
          backend->conv2d_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                                   workspace.data(), columns.data(), s);
          CHECK(dx == dx_ref);
          CHECK(dw == dw_ref);
          CHECK(db == db_ref);
        }
        std::fill(dw.begin(), dw.end(), 7.0f);
        backend->conv2d_backward(x.data(), w.data(), dy.data(), nullptr, dw.data(), db.data(),
                                 workspace.data(), columns.data(), s);
        CHECK(dw == dw_ref);
      }
    }
  }
  // Over the bound (2^24 floats), and where oneDNN convolves without im2col,
  // nothing is kept.
  backend->set_precision(Precision::fp32);
  CHECK(backend->conv2d_columns(ConvShape{1000, 16, 20, 20, 8, 3}) == 0);
  CHECK(make_cpu_backend(1, CpuKernels::onednn)->conv2d_columns(shapes[3]) == 0);
}

TEST_CASE("cpu backend: PSTRAIN_CPU_KERNELS picks the kernel library, oneDNN unless told") {
  auto with = [](const char* value) {
    if (value) {
      setenv("PSTRAIN_CPU_KERNELS", value, 1);
    } else {
      unsetenv("PSTRAIN_CPU_KERNELS");
    }
    return cpu_kernels_from_env();
  };
  CHECK(with(nullptr) == CpuKernels::onednn);
  CHECK(with("") == CpuKernels::onednn);
  CHECK(with("onednn") == CpuKernels::onednn);
  CHECK(with("openblas") == CpuKernels::openblas);
  CHECK_THROWS_WITH_AS(with("mkl"), "PSTRAIN_CPU_KERNELS=mkl: expected onednn or openblas",
                       std::invalid_argument);
  unsetenv("PSTRAIN_CPU_KERNELS");
  CHECK(make_cpu_backend(1, CpuKernels::onednn)->name().find("oneDNN kernels") !=
        std::string::npos);
  CHECK(make_cpu_backend(1, CpuKernels::openblas)->name().find("OpenBLAS kernels") !=
        std::string::npos);
}

TEST_CASE("cpu relu matches the reference") {
  CpuOps ops;
  std::mt19937 rng(3);
  auto x = random_floats(101, rng);
  x[5] = 0.0f;
  const auto dy = random_floats(101, rng);
  std::vector<float> y(101), dx(101);
  std::vector<double> ry(101), rdx(101);
  ops.relu_forward(x.data(), y.data(), x.size());
  ops.relu_backward(y.data(), dy.data(), dx.data(), x.size());
  const auto x_ = to_double(x), dy_ = to_double(dy);
  reference::relu_forward(x_.data(), ry.data(), x.size());
  reference::relu_backward(ry.data(), dy_.data(), rdx.data(), x.size());
  check_close(y, ry, 0, "y");
  check_close(dx, rdx, 0, "dx");
  CHECK(dx[5] == 0.0f);
}

TEST_CASE("cpu maxpool matches the reference, ties and remainders included") {
  CpuOps ops;
  std::mt19937 rng(4);
  for (const PoolShape s : {PoolShape{2, 3, 7, 9, 2}, PoolShape{1, 2, 9, 6, 3},
                            PoolShape{3, 1, 4, 4, 1}, PoolShape{2, 4, 26, 26, 2}}) {
    CAPTURE(s.k);
    CAPTURE(s.h);
    const std::size_t xs = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    const std::size_t ys = static_cast<std::size_t>(s.n) * s.c * s.out_h() * s.out_w();
    // Few distinct values, so most windows hold ties.
    std::vector<float> x(xs);
    std::uniform_int_distribution<int> level(0, 3);
    for (float& v : x) v = static_cast<float>(level(rng));
    const auto dy = random_floats(ys, rng);
    std::vector<float> y(ys), dx(xs, 5.0f);
    std::vector<std::int32_t> argmax(ys), rargmax(ys);
    std::vector<double> ry(ys), rdx(xs);
    ops.maxpool_forward(x.data(), y.data(), argmax.data(), s);
    ops.maxpool_backward(dy.data(), argmax.data(), dx.data(), s);
    const auto x_ = to_double(x), dy_ = to_double(dy);
    reference::maxpool_forward(x_.data(), ry.data(), rargmax.data(), s);
    reference::maxpool_backward(dy_.data(), rargmax.data(), rdx.data(), s);
    check_close(y, ry, 0, "y");
    CHECK(argmax == rargmax);
    check_close(dx, rdx, 0, "dx");
  }
}

TEST_CASE("cpu softmax cross-entropy matches the reference and stays finite") {
  CpuOps ops;
  std::mt19937 rng(5);
  const int n = 9, classes = 7;
  auto logits = random_floats(n * classes, rng, -5, 5);
  // Huge logits must not overflow; equal logits pick the first class.
  for (int j = 0; j < classes; ++j) logits[j] = 1000.0f + static_cast<float>(j % 2);
  for (int j = 0; j < classes; ++j) logits[classes + j] = 2.0f;
  std::vector<std::int32_t> labels(n);
  std::uniform_int_distribution<int> label(0, classes - 1);
  for (auto& l : labels) l = label(rng);
  labels[1] = 0;
  std::vector<float> dlogits(logits.size()), loss(n), correct(n);
  std::vector<double> rd(logits.size()), rloss(n), rcorrect(n);
  ops.softmax_xent(logits.data(), labels.data(), dlogits.data(), loss.data(), correct.data(), n,
                   classes);
  const auto l_ = to_double(logits);
  reference::softmax_xent(l_.data(), labels.data(), rd.data(), rloss.data(), rcorrect.data(), n,
                          classes);
  check_close(dlogits, rd, 1e-5, "dlogits");
  check_close(loss, rloss, 1e-5, "loss");
  check_close(correct, rcorrect, 0, "correct");
  CHECK(correct[1] == 1.0f);
  CHECK(std::isfinite(loss[0]));

  labels[3] = classes;
  CHECK_THROWS_WITH_AS(ops.softmax_xent(logits.data(), labels.data(), dlogits.data(), loss.data(),
                                        correct.data(), n, classes),
                       "softmax_xent: label 7 of sample 3 is not in [0, 7)", std::invalid_argument);
}

TEST_CASE("elementwise: argmax takes the first maximum") {
  const float row[] = {1.0f, 3.0f, 3.0f, -2.0f};
  CHECK(ew::argmax(row, 4) == 1);
  CHECK(ew::argmax(row, 1) == 0);
  CHECK(ew::relu_grad(0.0f, 5.0f) == 0.0f);
  CHECK(ew::xent_loss(2.0f, 2.0f) == 0.0f);
}

TEST_CASE("apply_optimizers equals apply_optimizer on each tensor, bit for bit") {
  auto backend = make_cpu_backend(1);
  std::mt19937 rng(11);
  for (auto kind :
       {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam, OptimizerKind::adagrad}) {
    OptimizerConfig config;
    config.kind = kind;
    config.lr = 0.05f;
    config.weight_decay = 0.01f;
    const std::size_t slots = Optimizer(config).state_slots();
    // Sizes on both sides of a SIMD width, and an empty tensor.
    const std::vector<std::size_t> sizes = {1000, 0, 3, 17, 64};
    std::vector<std::vector<float>> w, g, state;
    for (std::size_t n : sizes) {
      w.push_back(random_floats(n, rng));
      g.push_back(random_floats(n, rng));
      state.push_back(random_floats(n * slots, rng, 0, 1));
    }
    auto w2 = w, state2 = state;
    std::vector<OptimizerTensor> tensors;
    for (std::size_t t = 0; t < sizes.size(); ++t)
      tensors.push_back({w[t].data(), g[t].data(), slots ? state[t].data() : nullptr, sizes[t]});
    for (std::uint64_t step = 1; step <= 3; ++step) {
      backend->apply_optimizers(config, tensors, step, 0.5f);
      for (std::size_t t = 0; t < sizes.size(); ++t)
        backend->apply_optimizer(config, w2[t].data(), g[t].data(),
                                 slots ? state2[t].data() : nullptr, sizes[t], step, 0.5f);
    }
    INFO("optimizer " << std::string(to_string(kind)));
    CHECK(w == w2);
    CHECK(state == state2);
  }
}

TEST_CASE("conv2d_relu_forward is conv2d_forward then relu_forward") {
  auto backend = make_cpu_backend(1);
  std::mt19937 rng(12);
  const ConvShape s{2, 3, 7, 6, 4, 3};
  const std::size_t yn = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
  const auto x = random_floats(std::size_t(s.n) * s.c * s.h * s.w, rng);
  const auto w = random_floats(std::size_t(s.filters) * s.c * s.kernel * s.kernel, rng);
  const auto b = random_floats(s.filters, rng);
  std::vector<float> workspace(backend->conv2d_workspace(s)), y(yn), fused(yn);
  backend->conv2d_forward(x.data(), w.data(), b.data(), y.data(), workspace.data(), nullptr, s);
  backend->relu_forward(y.data(), y.data(), yn);
  backend->conv2d_relu_forward(x.data(), w.data(), b.data(), fused.data(), workspace.data(),
                               nullptr, s);
  CHECK(std::count(y.begin(), y.end(), 0.0f) > 0);
  CHECK(fused == y);
}

TEST_CASE("cpu backend: axpby, and b == 0 ignores what y held") {
  auto backend = make_cpu_backend(1);
  std::vector<float> x = {1, 2, 3}, y(3, std::nanf(""));
  backend->axpby(2.0f, x.data(), 0.0f, y.data(), 3);
  CHECK(y == std::vector<float>{2, 4, 6});
  backend->axpby(0.5f, x.data(), -1.0f, y.data(), 3);
  CHECK(y == std::vector<float>{-1.5f, -3, -4.5f});
}

TEST_CASE("cpu backend: memory, fences, scale and the optimizer step") {
  auto backend = make_cpu_backend(1);
  CHECK(backend->host_accessible());
  CHECK(backend->name().find(" 1 thread)") != std::string::npos);
  DeviceMemory a = backend->alloc(10 * sizeof(float));
  DeviceMemory empty = backend->alloc(0);
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0);
  CHECK(empty.data() != nullptr);
  backend->fill(a.data(), 2.0f, 10);
  backend->scale(a.data(), 0.5f, 10);
  HostMemory h = backend->alloc_host(10 * sizeof(float));
  backend->download(a.data(), h.data(), 10 * sizeof(float));
  const auto fence = backend->fence();
  CHECK(backend->fence_done(fence));
  backend->wait(fence);
  CHECK(std::all_of(h.data(), h.data() + 10, [](float v) { return v == 1.0f; }));

  // Momentum on the backend equals the shared Optimizer on host copies.
  OptimizerConfig config;
  config.kind = OptimizerKind::momentum;
  config.lr = 0.05f;
  std::vector<float> w = {1, -2, 3}, g = {0.5f, 0.25f, -1}, state(3, 0.0f);
  std::vector<float> w2 = w, state2 = state;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    backend->apply_optimizer(config, w.data(), g.data(), state.data(), 3, step, 0.5f);
    Optimizer(config).apply(w2, g, state2, step, 0.5f);
  }
  CHECK(w == w2);
  CHECK(state == state2);
  CHECK_THROWS_AS(make_cpu_backend(0), std::invalid_argument);
}

TEST_CASE("cpu embedding lookups and their segment sums give the reference's bits") {
  auto cpu = make_cpu_backend(1);
  std::mt19937 rng(3);
  // A bag by sum and by mean, and one id per block; the layer's columns
  // inside a wider row (stride) and alone.
  struct Case {
    bool bag, mean;
    int k, stride_extra;
  };
  for (const Case c : {Case{true, false, 3, 5}, Case{true, true, 4, 0}, Case{false, false, 3, 2},
                       Case{false, false, 1, 0}}) {
    const bool bag = c.bag, mean = c.mean;
    const int k = c.k, stride_extra = c.stride_extra;
    CAPTURE(bag);
    CAPTURE(mean);
    CAPTURE(k);
    const int n = 9, dim = 5, unique = 7;
    const EmbeddingShape s{n, k, dim, (bag ? dim : k * dim) + stride_extra, unique, bag, mean};
    std::vector<std::int32_t> inverse(static_cast<std::size_t>(n) * k);
    for (auto& v : inverse) v = static_cast<std::int32_t>(rng() % unique);
    for (int u = 0; u < unique; ++u) inverse[static_cast<std::size_t>(u)] = u;  // every row used
    const auto rows = random_floats(static_cast<std::size_t>(unique) * dim, rng);
    const auto dout = random_floats(static_cast<std::size_t>(n) * s.stride, rng);
    std::vector<float> out(static_cast<std::size_t>(n) * s.stride, 7.0f), want = out;
    cpu->embedding_forward(rows.data(), inverse.data(), out.data(), s);
    reference::embedding_forward(rows.data(), inverse.data(), want.data(), s);
    CHECK(out == want);  // the columns beyond the layer's are left alone

    std::vector<std::int32_t> by_row, offsets;
    reference::occurrences_by_row(inverse, unique, by_row, offsets);
    std::vector<float> drows(static_cast<std::size_t>(unique) * dim, 7.0f);
    std::vector<float> want_drows(drows.size());
    cpu->embedding_backward(dout.data(), by_row.data(), offsets.data(), drows.data(), s);
    reference::embedding_backward(dout.data(), inverse.data(), want_drows.data(), s);
    CHECK(drows == want_drows);
    // And in double: the float sums are close to the exact ones.
    std::vector<double> exact(drows.size());
    reference::embedding_backward(to_double(dout).data(), inverse.data(), exact.data(), s);
    check_close(drows, exact, 1e-6, "embedding drows");
  }
}
