// Tests of the CUDA backend and the NCCL communicator on a real GPU: every op
// against the double-precision reference, transfers and their ordering,
// fences, the optimizers against their shared per-element math, NCCL, step
// graphs (CUDA graphs) against eager steps, and a short training run. Needs
// only the CUDA libraries, libpstrain_cuda.so and headers, so it can be
// copied to a GPU host. Exits 77 (skipped) without a
// device, and also when every case that ran passed but a case that needs
// more devices than the host has was left out (it is named on stdout), so a
// case that did not run is never counted as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "client/comm/communicator.h"
#include "client/compute/backend.h"
#include "client/compute/cuda_api.h"
#include "shared/config.h"
#include "shared/low_precision.h"
#include "shared/optimizer_math.h"
#include "tests/support/gpu_exit.h"
#include "tests/support/reference_layers.h"

namespace {

using pstrain::Backend;
using pstrain::ConvShape;
using pstrain::PoolShape;
namespace ref = pstrain::reference;

std::unique_ptr<Backend> make_backend(int device = 0) {
  std::array<char, 512> error{};
  std::unique_ptr<Backend> backend(pstrain_cuda_create_backend(device, error.data(), error.size()));
  if (!backend) throw std::runtime_error(error.data());
  return backend;
}

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A device buffer with its size in elements, filled from and read back to
// host vectors.
template <class T = float>
struct Buffer {
  Buffer(Backend& b, std::size_t n) : backend(&b), size(n), memory(b.alloc(n * sizeof(T))) {}
  Buffer(Backend& b, const std::vector<T>& v) : Buffer(b, v.size()) {
    backend->upload(v.data(), data(), v.size() * sizeof(T));
    backend->synchronize();  // v may go away after the constructor
  }
  T* data() const { return memory.template data<T>(); }
  std::vector<T> read() const {
    std::vector<T> out(size);
    backend->download(data(), out.data(), size * sizeof(T));
    backend->synchronize();
    return out;
  }
  Backend* backend;
  std::size_t size;
  pstrain::DeviceMemory memory;
};

// Holds the backend's compute stream (a kernel spinning on a flag in pinned
// memory) until release() or the end of the scope, so that the ops issued
// meanwhile are really pending when a test looks at fences and transfers.
class ComputeHold {
 public:
  explicit ComputeHold(Backend& b) : flag_(b.alloc_host(sizeof(std::int32_t))) {
    std::atomic_ref(*flag_.data<std::int32_t>()).store(0);
    std::array<char, 512> error{};
    if (pstrain_cuda_hold_compute(&b, flag_.data<std::int32_t>(), error.data(), error.size()) != 0)
      throw std::runtime_error(error.data());
  }
  ~ComputeHold() { release(); }
  ComputeHold(const ComputeHold&) = delete;
  ComputeHold& operator=(const ComputeHold&) = delete;
  void release() { std::atomic_ref(*flag_.data<std::int32_t>()).store(1); }

 private:
  pstrain::HostMemory flag_;
};

// Pinned host memory of n floats, all `value`.
pstrain::HostMemory host_filled(Backend& b, std::size_t n, float value) {
  auto memory = b.alloc_host(n * sizeof(float));
  std::fill_n(memory.data(), n, value);
  return memory;
}

bool all_equal(const pstrain::HostMemory& memory, std::size_t n, float value) {
  const float* p = memory.data();
  return std::all_of(p, p + n, [&](float v) { return v == value; });
}

// Float results against the double reference: relative to the magnitude of
// the terms summed, which bounds float rounding (`scale`).
void check_close(const std::vector<float>& got, const std::vector<double>& want, const char* what,
                 double tolerance = 1e-4) {
  REQUIRE(got.size() == want.size());
  double scale = 1e-30;
  for (double w : want) scale = std::max(scale, std::abs(w));
  std::size_t bad = 0, first_bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= tolerance * (std::abs(want[i]) + scale))) {
      if (bad++ == 0) first_bad = i;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " differ; first at " << first_bad << ": got "
            << (bad ? got[first_bad] : 0) << ", want " << (bad ? want[first_bad] : 0));
  CHECK(bad == 0);
}

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

// Whether the library finds a cuDNN it can use on this host (before the
// backend's probe): the conv cases then demand that it serves.
bool cudnn_usable() {
  std::array<char, 512> text{};
  const bool usable = pstrain_cudnn_status(text.data(), text.size()) == 1;
  MESSAGE("cuDNN: " << (usable ? "" : "not usable: ") << text.data());
  return usable;
}

std::string describe(const pstrain::PathCounts& paths) {
  std::string text;
  for (const auto& [path, count] : paths) text += path + " " + std::to_string(count) + "; ";
  return text;
}

// How often `path` ran between two path_counts().
std::uint64_t ran(const pstrain::PathCounts& before, const pstrain::PathCounts& after,
                  const std::string& path) {
  const auto at = [&](const pstrain::PathCounts& p) {
    const auto found = p.find(path);
    return found == p.end() ? std::uint64_t{0} : found->second;
  };
  return at(after) - at(before);
}

// Both convolution paths: cuDNN where it loads, and im2col + cuBLAS, which
// PSTRAIN_CUDNN_LIB=off selects for backends made while it is set.
std::unique_ptr<Backend> make_conv_backend(bool cudnn) {
  if (!cudnn) setenv("PSTRAIN_CUDNN_LIB", "off", 1);
  auto b = make_backend();
  if (!cudnn) unsetenv("PSTRAIN_CUDNN_LIB");
  MESSAGE("convolutions on " << b->name());
  if (!cudnn) CHECK(b->name().find("im2col convolutions") != std::string::npos);
  return b;
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

// Mixed precision (train.precision, client/compute/backend.h): a backend's GEMMs at
// bf16 and fp16 against the double reference on operands rounded with
// shared/low_precision.h, the rounding the CPU backend is tested with. Each
// precision the backend reports unavailable is skipped, saying why.
std::vector<double> rounded(const std::vector<float>& v, pstrain::HalfFormat format) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = pstrain::round_to_half(format, v[i]);
  return out;
}

std::vector<double> rounded(const std::vector<double>& v, pstrain::HalfFormat format) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = pstrain::round_to_half(format, static_cast<float>(v[i]));
  return out;
}

struct LowPrecision {
  pstrain::Precision precision;
  pstrain::HalfFormat format;
};
constexpr LowPrecision kLowPrecisions[] = {{pstrain::Precision::bf16, pstrain::HalfFormat::bf16},
                                           {pstrain::Precision::fp16, pstrain::HalfFormat::fp16}};

// Whether `b` computes at p; when not, says so.
bool computes_at(Backend& b, pstrain::Precision p) {
  const std::string why = b.precision_unavailable(p);
  if (!why.empty()) MESSAGE(to_string(p) << " skipped: " << why);
  return why.empty();
}

// The products are exact in float32 and summed in float32 (tensor cores
// included), so the results differ from the reference by float32
// accumulation only: 1e-4 of the largest term, as check_close measures, for
// the sizes here (k <= 784); rounding the operands alone moves results by
// about 2^-9 (bf16) or 2^-12 (fp16) relative, well above it.
constexpr double kLowPrecisionTolerance = 1e-4;

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

TEST_CASE("transfers round-trip and keep issue order across the two streams") {
  auto b = make_backend();
  std::mt19937 rng(7);
  const std::size_t n = 1 << 20;
  auto pinned_in = b->alloc_host(n * sizeof(float));
  auto pinned_out = b->alloc_host(n * sizeof(float));
  const auto input = random_vector(n, rng);
  std::memcpy(pinned_in.data(), input.data(), n * sizeof(float));
  Buffer<> x(*b, n);
  b->upload(pinned_in.data(), x.data(), n * sizeof(float));
  b->download(x.data(), pinned_out.data(), n * sizeof(float));
  b->synchronize();
  CHECK(std::memcmp(pinned_out.data(), input.data(), n * sizeof(float)) == 0);

  // Each round uploads into buffers that the previous round's compute still
  // reads and writes, and downloads what this round's compute produced: any
  // missing wait between the streams shows up as a wrong value. Round r
  // expects 6 (r + 1), which neither a stale round (6 r), the fills (-1,
  // or 0 after the relu), nor untouched host memory (NaN) can give.
  const int rounds = 20;
  const std::size_t m = 1 << 18;
  Buffer<> a(*b, m), c(*b, m);
  std::vector<pstrain::HostMemory> in, out;
  for (int r = 0; r < rounds; ++r) {
    in.push_back(host_filled(*b, m, float(r + 1)));
    out.push_back(host_filled(*b, m, NAN));
  }
  for (int r = 0; r < rounds; ++r) {
    b->upload(in[r].data(), a.data(), m * sizeof(float));
    b->scale(a.data(), 2.0f, m);
    b->relu_forward(a.data(), c.data(), m);
    b->scale(c.data(), 3.0f, m);
    b->download(c.data(), out[r].data(), m * sizeof(float));
    b->fill(a.data(), -1.0f, m);
    b->fill(c.data(), -1.0f, m);
  }
  b->synchronize();
  for (int r = 0; r < rounds; ++r) {
    CHECK_MESSAGE(all_equal(out[r], m, 6.0f * float(r + 1)), "round " << r);
  }

  // Memory the backend did not allocate orders against everything.
  float* raw = nullptr;
  REQUIRE(cudaMalloc(&raw, m * sizeof(float)) == cudaSuccess);
  b->upload(in[3].data(), raw, m * sizeof(float));
  b->scale(raw, 2.0f, m);
  b->download(raw, out[0].data(), m * sizeof(float));
  b->synchronize();
  CHECK(all_equal(out[0], m, 8.0f));
  REQUIRE(cudaFree(raw) == cudaSuccess);
}

TEST_CASE("transfers wait for the compute they depend on, and only for it") {
  auto b = make_backend();
  const std::size_t m = 1 << 16;
  Buffer<> a(*b, std::vector<float>(m, 5.0f)), unrelated(*b, std::vector<float>(m, 4.0f));
  Buffer<> c(*b, m);
  b->fill(c.data(), -2.0f, m);  // what a download that does not wait would see
  auto in = host_filled(*b, m, 7.0f);
  auto out_a = host_filled(*b, m, NAN), out_c = host_filled(*b, m, NAN);
  auto out_unrelated = host_filled(*b, m, NAN);
  b->synchronize();

  ComputeHold hold(*b);
  b->scale(a.data(), 2.0f, m);  // a = 10
  b->download(unrelated.data(), out_unrelated.data(), m * sizeof(float));
  b->relu_forward(a.data(), c.data(), m);  // c = 10
  b->download(c.data(), out_c.data(), m * sizeof(float));
  b->upload(in.data(), a.data(), m * sizeof(float));  // after the relu read a = 10
  b->scale(a.data(), 3.0f, m);                        // a = 21
  b->download(a.data(), out_a.data(), m * sizeof(float));

  // The download that needs no compute lands while the compute stream is
  // held; the ones that need the held work do not.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!all_equal(out_unrelated, m, 4.0f) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(all_equal(out_unrelated, m, 4.0f));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(std::isnan(out_c.data()[0]));
  CHECK(std::isnan(out_a.data()[0]));

  hold.release();
  b->synchronize();
  // An upload that overtook the first scale gives c = 14, a = 42; one that
  // overtook the relu gives c = 14; downloads that did not wait give -2 or 5.
  CHECK(all_equal(out_c, m, 10.0f));
  CHECK(all_equal(out_a, m, 21.0f));
}

TEST_CASE("fences complete when, and only when, the work before them has") {
  auto b = make_backend();
  Buffer<> x(*b, std::vector<float>(1 << 20, 1.0f));
  const auto before = b->fence();
  ComputeHold hold(*b);
  b->scale(x.data(), 3.0f, x.size);
  const auto f1 = b->fence();
  const auto f2 = b->fence();
  CHECK(f2 > f1);
  // The fence issued before the hold completes while the stream is held.
  b->wait(before);
  CHECK(b->fence_done(before));
  // A fence that recorded nothing, or only on one stream, would be done by now.
  for (int i = 0; i < 50; ++i) {
    REQUIRE_FALSE(b->fence_done(f1));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK_FALSE(b->fence_done(f2));
  hold.release();
  b->wait(f2);
  CHECK(b->fence_done(f1));  // an earlier fence is done once a later one is
  CHECK(b->fence_done(f2));
  const auto got = x.read();
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 3.0f; }));

  // Fences retire in any order of asking.
  std::vector<Backend::Fence> many;
  ComputeHold second(*b);
  for (int i = 0; i < 1000; ++i) many.push_back(b->fence());
  CHECK_FALSE(b->fence_done(many.front()));
  second.release();
  b->wait(many.back());
  CHECK(std::all_of(many.begin(), many.end(), [&](auto f) { return b->fence_done(f); }));
}

std::unique_ptr<pstrain::Communicator> make_comm(Backend& backend,
                                                 const std::array<std::uint8_t, 128>& id, int rank,
                                                 int size) {
  std::array<char, 512> error{};
  std::unique_ptr<pstrain::Communicator> comm(pstrain_nccl_create(
      &backend, id.data(), id.size(), rank, size, 60.0, error.data(), error.size()));
  if (!comm) throw std::runtime_error(error.data());
  return comm;
}

std::array<std::uint8_t, 128> unique_id() {
  std::array<std::uint8_t, 128> id{};
  std::array<char, 512> error{};
  REQUIRE_MESSAGE(pstrain_nccl_unique_id(id.data(), id.size(), error.data(), error.size()) == 0,
                  error.data());
  return id;
}

// With one rank a sum is the identity, so this case checks what one rank can
// show: the collectives are queued in order with the backend's ops (behind
// held work, which they must not overtake: a collective that read or wrote
// early would lose a scale) and the errors. Sums across ranks are the
// all-devices case's, skipped on a one-GPU host.
TEST_CASE("nccl with one rank: collectives keep their place among the backend's ops") {
  auto b = make_backend();
  auto comm = make_comm(*b, unique_id(), 0, 1);
  CHECK(comm->name() == "nccl");
  CHECK(comm->size() == 1);
  std::vector<float> v(1 << 20);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 1000 + 1);
  Buffer<> x(*b, v);
  ComputeHold hold(*b);
  b->scale(x.data(), 2.0f, v.size());
  comm->allreduce_sum(x.data(), v.size());
  b->scale(x.data(), 3.0f, v.size());
  comm->broadcast(x.data(), v.size(), 0);
  b->scale(x.data(), 0.5f, v.size());
  const auto queued = b->fence();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(b->fence_done(queued));
  hold.release();
  comm->barrier();
  CHECK(b->fence_done(queued));
  const auto got = x.read();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i) wrong += got[i] != 3.0f * v[i];
  CHECK_MESSAGE(wrong == 0, wrong << " elements are not 3x their input; element 7 is " << got[7]);
  CHECK_THROWS_AS(comm->broadcast(x.data(), 1, 1), std::invalid_argument);
  std::array<char, 512> error{};
  const auto id = unique_id();
  CHECK(pstrain_nccl_create(b.get(), id.data(), id.size(), 2, 2, 5.0, error.data(), error.size()) ==
        nullptr);
  CHECK(std::string(error.data()).find("rank 2 is not in a group of size 2") != std::string::npos);
}

TEST_CASE("nccl: a collective runs alongside compute it does not depend on") {
  auto b = make_backend();
  auto comm = make_comm(*b, unique_id(), 0, 1);
  const std::size_t m = 1 << 16;
  Buffer<> x(*b, std::vector<float>(m, 1.0f)), y(*b, std::vector<float>(m, 9.0f));
  auto out = host_filled(*b, m, NAN);
  ComputeHold hold(*b);
  b->scale(x.data(), 2.0f, m);  // held
  comm->allreduce_sum(y.data(), m);
  b->download(y.data(), out.data(), m * sizeof(float));  // waits for the collective alone
  // On the compute stream, the collective and so the download would wait
  // for the held scale.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!all_equal(out, m, 9.0f) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(all_equal(out, m, 9.0f));
  const auto f = b->fence();
  CHECK_FALSE(b->fence_done(f));
  hold.release();
  b->wait(f);
  const auto got = x.read();
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 2.0f; }));
  // Both collectives' device time is reported once they are done.
  comm->mark();
  comm->allreduce_sum(y.data(), m);
  b->synchronize();
  const auto times = comm->device_times();
  REQUIRE(times.has_value());
  CHECK(times->busy_ms > 0);
  CHECK(times->after_mark_ms > 0);            // the second ran after the mark
  CHECK(comm->device_times()->busy_ms == 0);  // reported once
}

// A small MLP or CNN in backend calls over fixed buffers, as Model lays
// out a step: forward, loss, backward and Adam (whose bias corrections
// follow the step count). Batches come through pinned staging memory,
// uploaded without a synchronization, so a step that did not wait for
// them reads the previous batch.
class TinyNet {
 public:
  static constexpr int kN = 32, kSide = 12, kPixels = kSide * kSide, kClasses = 10;
  static constexpr int kHidden = 64, kFilters = 8, kPooled = kFilters * 5 * 5;

  TinyNet(Backend& b, bool cnn)
      : b_(b),
        cnn_(cnn),
        conv_{kN, 1, kSide, kSide, kFilters, 3},
        pool_{kN, kFilters, kSide - 2, kSide - 2, 2},
        x_(b, std::size_t(kN) * kPixels),
        labels_(b, kN),
        act_(b, std::size_t(kN) * std::max(kHidden, kFilters * (kSide - 2) * (kSide - 2))),
        pooled_(b, std::size_t(kN) * kPooled),
        logits_(b, std::size_t(kN) * kClasses),
        dlogits_(b, logits_.size),
        loss_(b, kN),
        correct_(b, kN),
        dact_(b, act_.size),
        dpooled_(b, pooled_.size),
        argmax_(b, pooled_.size),
        workspace_(b, cnn ? std::max<std::size_t>(b.conv2d_workspace(conv_), 1) : 1),
        staged_x_(b.alloc_host(x_.size * sizeof(float))),
        staged_labels_(b.alloc_host(kN * sizeof(std::int32_t))) {
    adam_.kind = pstrain::OptimizerKind::adam;
    adam_.lr = 0.01f;
    const std::vector<std::size_t> sizes =
        cnn ? std::vector<std::size_t>{kFilters * 9, kFilters, std::size_t(kPooled) * kClasses,
                                       kClasses}
            : std::vector<std::size_t>{std::size_t(kPixels) * kHidden, kHidden,
                                       std::size_t(kHidden) * kClasses, kClasses};
    for (std::size_t size : sizes) {
      params_.emplace_back(b, size);
      grads_.emplace_back(b, size);
      state_.emplace_back(b, 2 * size);
    }
  }

  // Weights from `rng`, Adam's state zero.
  void initialize(std::mt19937& rng) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto w = random_vector(params_[i].size, rng, -0.2f, 0.2f);
      b_.upload(w.data(), params_[i].data(), w.size() * sizeof(float));
      b_.fill(state_[i].data(), 0.0f, state_[i].size);
      b_.synchronize();
    }
  }

  // Issues the batch's upload; the staging memory is reused once the step's
  // results were read (read() synchronizes).
  void load(const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
    std::copy(x.begin(), x.end(), staged_x_.data());
    std::copy(labels.begin(), labels.end(), staged_labels_.data<std::int32_t>());
    b_.upload(staged_x_.data(), x_.data(), x.size() * sizeof(float));
    b_.upload(staged_labels_.data(), labels_.data(), labels.size() * sizeof(std::int32_t));
  }

  void step(const pstrain::StepScalars& s) {
    const float* features = x_.data();
    int width = kPixels;
    if (cnn_) {
      b_.conv2d_forward(x_.data(), params_[0].data(), params_[1].data(), act_.data(),
                        workspace_.data(), nullptr, conv_);
      b_.relu_forward(act_.data(), act_.data(), act_.size);
      b_.maxpool_forward(act_.data(), pooled_.data(), argmax_.data(), pool_);
      features = pooled_.data();
      width = kPooled;
    } else {
      b_.dense_forward(x_.data(), params_[0].data(), params_[1].data(), act_.data(), kN, kPixels,
                       kHidden);
      b_.relu_forward(act_.data(), act_.data(), std::size_t(kN) * kHidden);
      features = act_.data();
      width = kHidden;
    }
    b_.dense_forward(features, params_[2].data(), params_[3].data(), logits_.data(), kN, width,
                     kClasses);
    b_.softmax_xent(logits_.data(), labels_.data(), dlogits_.data(), loss_.data(), correct_.data(),
                    kN, kClasses);
    b_.dense_backward(features, params_[2].data(), dlogits_.data(),
                      cnn_ ? dpooled_.data() : dact_.data(), grads_[2].data(), grads_[3].data(), kN,
                      width, kClasses);
    if (cnn_) {
      b_.maxpool_backward(dpooled_.data(), argmax_.data(), dact_.data(), pool_);
      b_.relu_backward(act_.data(), dact_.data(), dact_.data(), act_.size);
      b_.conv2d_backward(x_.data(), params_[0].data(), dact_.data(), nullptr, grads_[0].data(),
                         grads_[1].data(), workspace_.data(), nullptr, conv_);
    } else {
      b_.relu_backward(act_.data(), dact_.data(), dact_.data(), std::size_t(kN) * kHidden);
      b_.dense_backward(x_.data(), params_[0].data(), dact_.data(), nullptr, grads_[0].data(),
                        grads_[1].data(), kN, kPixels, kHidden);
    }
    for (std::size_t i = 0; i < params_.size(); ++i)
      b_.apply_optimizer(adam_, params_[i].data(), grads_[i].data(), state_[i].data(),
                         params_[i].size, s.step, s.lr_scale);
  }

  // Weights, optimizer state and losses, concatenated.
  std::vector<float> read() const {
    std::vector<float> all = loss_.read();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      for (const auto* buffer : {&params_[i], &state_[i]}) {
        const auto v = buffer->read();
        all.insert(all.end(), v.begin(), v.end());
      }
    }
    return all;
  }

 private:
  Backend& b_;
  bool cnn_;
  ConvShape conv_;
  PoolShape pool_;
  pstrain::OptimizerConfig adam_;
  Buffer<> x_;
  Buffer<std::int32_t> labels_;
  Buffer<> act_, pooled_, logits_, dlogits_, loss_, correct_, dact_, dpooled_;
  Buffer<std::int32_t> argmax_;
  Buffer<> workspace_;
  std::vector<Buffer<>> params_, grads_, state_;
  pstrain::HostMemory staged_x_, staged_labels_;
};

// A random batch for TinyNet.
std::pair<std::vector<float>, std::vector<std::int32_t>> tiny_batch(std::mt19937& rng) {
  std::vector<std::int32_t> labels(TinyNet::kN);
  for (auto& l : labels) l = std::int32_t(rng() % TinyNet::kClasses);
  return {random_vector(std::size_t(TinyNet::kN) * TinyNet::kPixels, rng), labels};
}

// Bit for bit, as the same kernels on the same inputs give.
void check_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                     const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  }
  INFO(what << ": " << differ << " of " << got.size() << " differ; first at " << first << ": got "
            << got[first] << ", want " << want[first]);
  CHECK(differ == 0);
}

TEST_CASE("a step graph replays forward, backward and Adam bit for bit like eager steps") {
  auto b = make_backend();
  for (const bool cnn : {false, true}) {
    INFO((cnn ? "cnn" : "mlp"));
    TinyNet eager(*b, cnn), recorded(*b, cnn);
    std::mt19937 init_eager(20), init_recorded(20), data(21);
    eager.initialize(init_eager);
    recorded.initialize(init_recorded);
    auto graph = b->make_step_graph([&](const pstrain::StepScalars& s) { recorded.step(s); });
    std::vector<float> before = recorded.read();
    for (int step = 1; step <= 6; ++step) {
      INFO("step " << step);
      const auto [x, labels] = tiny_batch(data);
      eager.load(x, labels);
      recorded.load(x, labels);
      // A new step count (Adam's bias corrections) and learning-rate scale
      // every step: a replay that kept the recording's would differ.
      const pstrain::StepScalars scalars{std::uint64_t(step), 1.0f / float(step)};
      eager.step(scalars);  // first: the recording then finds every plan made
      graph->run(scalars);
      const auto after = recorded.read();
      check_same_bits(after, eager.read(), "recorded against eager");
      CHECK(after != before);  // the step did something
      before = after;
    }
    const auto paths = b->path_counts();
    INFO("paths: " << describe(paths));
    CHECK(paths.at("step_graph recorded") == (cnn ? 2u : 1u));
    CHECK(paths.at("step_graph replayed") == (cnn ? 10u : 5u));
  }
}

TEST_CASE("a step graph sees weights written after its capture") {
  auto b = make_backend();
  TinyNet eager(*b, false), recorded(*b, false);
  std::mt19937 init_eager(30), init_recorded(30), data(31);
  eager.initialize(init_eager);
  recorded.initialize(init_recorded);
  auto graph = b->make_step_graph([&](const pstrain::StepScalars& s) { recorded.step(s); });
  const auto [x, labels] = tiny_batch(data);
  eager.load(x, labels);
  eager.step({1, 1.0f});  // plans made outside the capture, as a trainer's warm-up does
  recorded.load(x, labels);
  graph->run({1, 1.0f});  // captured with these weights
  (void)recorded.read();
  // New weights and a fresh optimizer state on both, as a pull brings them;
  // uploads in issue order, no synchronization before the replay.
  std::mt19937 again_eager(32), again_recorded(32);
  eager.initialize(again_eager);
  recorded.initialize(again_recorded);
  eager.load(x, labels);
  recorded.load(x, labels);
  eager.step({1, 1.0f});
  graph->run({1, 1.0f});
  check_same_bits(recorded.read(), eager.read(), "replay after new weights");
}

TEST_CASE(
    "a step graph whose work needs the host throws, runs none of it, and leaves the backend "
    "working") {
  auto b = make_backend();
  const std::size_t n = 4096;
  Buffer<> x(*b, n);
  b->fill(x.data(), 1.0f, n);  // the kernel loaded outside the capture
  // A host wait (as all_finite and axpby make): no capture can hold that.
  auto graph = b->make_step_graph([&](const pstrain::StepScalars&) {
    b->fill(x.data(), 7.0f, n);
    b->synchronize();
  });
  CHECK_THROWS_WITH_AS(graph->run({1, 1.0f}), doctest::Contains("a step graph cannot record"),
                       std::invalid_argument);
  for (float v : x.read())
    if (v != 1.0f) FAIL("the failed capture ran its fill: " << v);
  // The compute stream is no longer capturing: eager work runs, ordered as usual.
  b->fill(x.data(), 3.0f, n);
  b->scale(x.data(), 2.0f, n);
  for (float v : x.read())
    if (v != 6.0f) FAIL("eager work after the failed capture gave " << v);
}

TEST_CASE("cuBLASLt serves the MLP's dense layers, counted as it runs") {
  auto b = make_backend();
  std::mt19937 rng(40);
  // The mlp preset's shapes at batch 64 (784 -> 256 -> 128 -> 10).
  for (const auto& [n, in, out] :
       {std::tuple{64, 784, 256}, std::tuple{64, 256, 128}, std::tuple{64, 128, 10}}) {
    INFO(n << " x " << in << " -> " << out);
    const auto x = random_vector(std::size_t(n) * in, rng),
               w = random_vector(std::size_t(in) * out, rng);
    const auto bias = random_vector(out, rng), dy = random_vector(std::size_t(n) * out, rng);
    Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), bdy(*b, dy);
    Buffer<> y(*b, std::size_t(n) * out), dx(*b, std::size_t(n) * in), dw(*b, w.size()),
        db(*b, bias.size());
    const auto before = b->path_counts();
    b->dense_forward(bx.data(), bw.data(), bb.data(), y.data(), n, in, out);
    b->dense_backward(bx.data(), bw.data(), bdy.data(), dx.data(), dw.data(), db.data(), n, in,
                      out);
    b->synchronize();
    const auto after = b->path_counts();
    INFO("paths: " << describe(after));
    // Forward, and the weight gradient with the bias gradient, fused: the
    // hidden layers' shapes at least (whether the 10-wide output layer has a
    // plan is cuBLASLt's call; its fallback computes the same).
    CHECK(ran(before, after, "dense cublaslt") + ran(before, after, "dense cublaslt refused") == 2);
    if (out != 10) CHECK(ran(before, after, "dense cublaslt") == 2);
    std::vector<double> ry(y.size), rdx(dx.size), rdw(dw.size), rdb(db.size);
    ref::dense_forward(widen(x).data(), widen(w).data(), widen(bias).data(), ry.data(), n, in, out);
    check_close(y.read(), ry, "dense y");
    ref::dense_backward(widen(x).data(), widen(w).data(), widen(dy).data(), rdx.data(), rdw.data(),
                        rdb.data(), n, in, out);
    check_close(dw.read(), rdw, "dense dw");
    check_close(db.read(), rdb, "dense db");
  }
}

// tests/support/fake_cudnn.cc's stand-ins, built into tests/fakes/ beside
// this executable.
std::string fake_cudnn(const char* name) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  REQUIRE_MESSAGE(!ec, "cannot read /proc/self/exe");
  const auto path = exe.parent_path() / "tests" / "fakes" / (std::string("lib") + name + ".so");
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string() << " is missing (build it)");
  return path.string();
}

TEST_CASE("a cuDNN that loads but cannot serve leaves convolutions on im2col, said and counted") {
  // fake_cudnn_broken lacks the convolution calls; fake_cudnn_partial has
  // them all but its sub-libraries are missing, which only the backend's
  // probe (running a tiny convolution) finds. Either way the backend starts,
  // names the im2col path, and its convolutions are right.
  for (const char* name : {"fake_cudnn_broken", "fake_cudnn_partial"}) {
    INFO(name);
    setenv("PSTRAIN_CUDNN_LIB", fake_cudnn(name).c_str(), 1);
    std::unique_ptr<Backend> b;
    try {
      b = make_backend();
    } catch (const std::exception& e) {
      unsetenv("PSTRAIN_CUDNN_LIB");
      FAIL("the backend did not start: " << e.what());
    }
    unsetenv("PSTRAIN_CUDNN_LIB");
    CHECK(b->name().find("im2col convolutions") != std::string::npos);
    const ConvShape s{4, 2, 9, 9, 5, 3};
    std::mt19937 rng(41);
    const std::size_t xn = std::size_t(s.n) * s.c * s.h * s.w;
    const std::size_t wn = std::size_t(s.filters) * s.c * s.kernel * s.kernel;
    const std::size_t yn = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
    const auto x = random_vector(xn, rng), w = random_vector(wn, rng);
    const auto bias = random_vector(s.filters, rng);
    Buffer<> bx(*b, x), bw(*b, w), bb(*b, bias), y(*b, yn);
    Buffer<> workspace(*b, b->conv2d_workspace(s));
    b->conv2d_forward(bx.data(), bw.data(), bb.data(), y.data(), workspace.data(), nullptr, s);
    std::vector<double> ry(yn);
    ref::conv2d_forward(widen(x).data(), widen(w).data(), widen(bias).data(), ry.data(), s);
    check_close(y.read(), ry, "conv y");
    const auto paths = b->path_counts();
    INFO("paths: " << describe(paths));
    CHECK(paths.count("conv2d im2col") == 1);
    CHECK(paths.count("conv2d cudnn") == 0);
  }
}

TEST_CASE("step graphs record fp32 steps only, and the backend itself refuses the others") {
  auto b = make_backend();
  CHECK(b->records_steps());
  const std::size_t n = 256;
  Buffer<> x(*b, std::vector<float>(n, 1.0f));
  {
    auto graph = b->make_step_graph([&](const pstrain::StepScalars&) { b->scale(x.data(), 2, n); });
    // While a graph exists, its steps must stay fp32.
    CHECK_THROWS_WITH_AS(b->set_precision(pstrain::Precision::fp16),
                         doctest::Contains("step graphs exist"), std::invalid_argument);
    graph->run({1, 1.0f});
    graph->run({2, 1.0f});
  }
  for (float v : x.read()) REQUIRE(v == 4.0f);
  b->set_precision(pstrain::Precision::fp16);
  CHECK_FALSE(b->records_steps());
  CHECK_THROWS_WITH_AS(b->make_step_graph([](const pstrain::StepScalars&) {}),
                       doctest::Contains("step graphs record fp32 steps only, not fp16"),
                       std::invalid_argument);
  b->set_precision(pstrain::Precision::fp32);
  CHECK(b->records_steps());
}

TEST_CASE(
    "apply_optimizers in a step graph after an NCCL all-reduce records, and replays exactly") {
  // The sync trainer's order: gradients all-reduced on NCCL's stream, then
  // the optimizer step from a graph. The capture must not make the compute
  // stream wait for the all-reduce's events (recorded outside the capture,
  // which CUDA refuses): the graph's launch waits for it instead.
  auto b = make_backend();
  auto comm = make_comm(*b, unique_id(), 0, 1);
  pstrain::OptimizerConfig adam;
  adam.kind = pstrain::OptimizerKind::adam;
  adam.lr = 0.01f;
  std::mt19937 rng(42);
  const std::vector<std::size_t> sizes{1 << 16, 1000, 10};
  std::vector<Buffer<>> eager_w, graph_w, grads, eager_state, graph_state;
  std::vector<pstrain::OptimizerTensor> eager, recorded;
  for (std::size_t size : sizes) {
    const auto w = random_vector(size, rng);
    eager_w.emplace_back(*b, w);
    graph_w.emplace_back(*b, w);
    grads.emplace_back(*b, size);
    eager_state.emplace_back(*b, std::vector<float>(2 * size, 0.0f));
    graph_state.emplace_back(*b, std::vector<float>(2 * size, 0.0f));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    eager.push_back({eager_w[i].data(), grads[i].data(), eager_state[i].data(), sizes[i]});
    recorded.push_back({graph_w[i].data(), grads[i].data(), graph_state[i].data(), sizes[i]});
  }
  auto graph = b->make_step_graph([&](const pstrain::StepScalars& s) {
    b->apply_optimizers(adam, recorded, s.step, s.lr_scale);
  });
  const auto before = b->path_counts();
  for (std::uint64_t step = 1; step <= 4; ++step) {
    INFO("step " << step);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto g = random_vector(sizes[i], rng);
      b->upload(g.data(), grads[i].data(), g.size() * sizeof(float));
      b->synchronize();                                // g goes out of scope
      comm->allreduce_sum(grads[i].data(), sizes[i]);  // one rank: the identity
    }
    const pstrain::StepScalars scalars{step, 1.0f / float(step)};
    graph->run(scalars);  // first, right behind the all-reduces
    b->apply_optimizers(adam, eager, scalars.step, scalars.lr_scale);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      check_same_bits(graph_w[i].read(), eager_w[i].read(), "weights");
      check_same_bits(graph_state[i].read(), eager_state[i].read(), "state");
    }
  }
  const auto after = b->path_counts();
  INFO("paths: " << describe(after));
  CHECK(ran(before, after, "step_graph recorded") == 1);
  CHECK(ran(before, after, "step_graph replayed") == 3);
}

// Cases that need more than one device, and how many: main() leaves them out
// on a host with fewer.
constexpr const char* kAllDevicesCase = "nccl across all devices of this host";
constexpr struct {
  const char* test_case;
  int devices;
} kNeedsDevices[] = {{kAllDevicesCase, 2}};

TEST_CASE(kAllDevicesCase) {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  REQUIRE_MESSAGE(devices >= 2, "the multi-GPU all-reduce needs two devices");
  const auto id = unique_id();
  std::vector<std::vector<float>> results(devices);
  std::vector<std::string> errors(devices);
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) {
    threads.emplace_back([&, d] {
      try {
        auto b = make_backend(d);
        auto comm = make_comm(*b, id, d, devices);
        Buffer<> x(*b, std::vector<float>(4096, float(d + 1)));
        comm->allreduce_sum(x.data(), x.size);
        results[d] = x.read();
      } catch (const std::exception& e) {
        errors[d] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const float want = float(devices * (devices + 1) / 2);
  for (int d = 0; d < devices; ++d) {
    CHECK_MESSAGE(errors[d].empty(), errors[d]);
    CHECK(std::all_of(results[d].begin(), results[d].end(), [&](float v) { return v == want; }));
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

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("gpu_tests: no CUDA device (%s): skipped\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return pstrain::testing::gpu_tests_exit_status(0, 0);
  }
  doctest::Context context(argc, argv);
  // Cases the host has too few devices for are skipped by name; the rest
  // decide the exit status.
  for (const auto& need : kNeedsDevices) {
    if (count >= need.devices) continue;
    std::printf("gpu_tests: skipped \"%s\": needs %d devices, this host has %d\n", need.test_case,
                need.devices, count);
    context.addFilter("test-case-exclude", need.test_case);
  }
  return pstrain::testing::gpu_tests_exit_status(count, context.run());
}
