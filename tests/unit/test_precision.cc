// Mixed precision on the CPU: the bf16 GEMMs against products computed in
// double from operands rounded with shared/low_precision.h, fp16's
// unavailability, the overflow check, and the fp16 loss scaler's schedule.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/train/loss_scaler.h"
#include "shared/low_precision.h"
#include "shared/metrics_registry.h"
#include "tests/support/staging_backend.h"

using namespace pstrain;

namespace {

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The value of an unlabelled series in the registry's exposition.
double series(const MetricsRegistry& registry, const std::string& name) {
  const std::string text = "\n" + registry.prometheus_text();
  const auto at = text.find("\n" + name + " ");
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(at + name.size() + 2));
}

float bf16(float x) { return round_to_half(HalfFormat::bf16, x); }

// C[m x n] = A[m x k] B[k x n] (row-major, either stored transposed), the
// operands rounded to bf16, summed in double; `magnitude` gets sum |a b|.
std::vector<double> reference(const std::vector<float>& a, bool a_t, const std::vector<float>& b,
                              bool b_t, int m, int n, int k, std::vector<double>& magnitude) {
  std::vector<double> c(static_cast<std::size_t>(m) * n, 0.0);
  magnitude.assign(c.size(), 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p) {
        const double x = bf16(a_t ? a[p * m + i] : a[i * k + p]);
        const double y = bf16(b_t ? b[j * k + p] : b[p * n + j]);
        c[i * n + j] += x * y;
        magnitude[i * n + j] += std::abs(x * y);
      }
  return c;
}

// Float32 accumulation of k exact products errs by at most about
// k * 2^-24 * sum |a b| (the classic bound for recursive summation; blocked
// GEMM kernels do better): 2^-16 * sum |a b| for the k <= 256 here. Rounding
// the operands to bf16 (2^-9 relative each, of random sign) moves a result
// by about 2^-9 / sqrt(k) * sum |a b|, 2^-13 here: an fp32 GEMM misses most.
constexpr double kTolerance = 1.0 / 65536;

// How many of `got` miss `expected` by more than the tolerance.
std::size_t misses(const std::vector<float>& got, const std::vector<double>& expected,
                   const std::vector<double>& magnitude, double bias = 0) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - (expected[i] + bias)) > kTolerance * magnitude[i] + 1e-30) ++count;
  return count;
}

}  // namespace

TEST_CASE("precision: cpu bf16 dense GEMMs equal double products of bf16-rounded operands") {
  constexpr int kN = 37, kIn = 256, kOut = 19;
  const auto x = random_floats(kN * kIn, 1), w = random_floats(kIn * kOut, 2);
  const auto dy = random_floats(kN * kOut, 3);
  const std::vector<float> zero_bias(kOut, 0.0f);
  auto cpu = make_cpu_backend(1);
  REQUIRE(cpu->precision_unavailable(Precision::bf16).empty());

  std::vector<double> magnitude;
  const auto y_ref = reference(x, false, w, false, kN, kOut, kIn, magnitude);
  std::vector<float> y(kN * kOut);
  cpu->dense_forward(x.data(), w.data(), zero_bias.data(), y.data(), kN, kIn, kOut);
  // fp32 misses the rounded reference: the check can tell the precisions apart.
  CHECK(misses(y, y_ref, magnitude) > y.size() / 2);

  cpu->set_precision(Precision::bf16);
  cpu->dense_forward(x.data(), w.data(), zero_bias.data(), y.data(), kN, kIn, kOut);
  CHECK(misses(y, y_ref, magnitude) == 0);

  std::vector<float> dx(kN * kIn), dw(kIn * kOut), db(kOut);
  cpu->dense_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), kN, kIn,
                      kOut);
  std::vector<double> dw_magnitude, dx_magnitude;
  CHECK(misses(dw, reference(x, true, dy, false, kIn, kOut, kN, dw_magnitude), dw_magnitude) == 0);
  CHECK(misses(dx, reference(dy, false, w, true, kN, kIn, kOut, dx_magnitude), dx_magnitude) == 0);

  // And back: fp32 again gives the plain float32 product.
  cpu->set_precision(Precision::fp32);
  cpu->dense_forward(x.data(), w.data(), zero_bias.data(), y.data(), kN, kIn, kOut);
  CHECK(misses(y, y_ref, magnitude) > y.size() / 2);
}

TEST_CASE("precision: cpu bf16 convolutions equal fp32 ones on bf16-rounded inputs") {
  const ConvShape s{5, 3, 12, 12, 8, 3};
  const std::size_t x_size = 5 * 3 * 12 * 12, w_size = 8 * 3 * 3 * 3;
  const std::size_t y_size = 5 * 8 * 10 * 10;
  const auto x = random_floats(x_size, 4), w = random_floats(w_size, 5);
  const auto dy = random_floats(y_size, 6);
  std::vector<float> xr(x), wr(w), dyr(dy), b(8, 0.25f);
  for (float& v : xr) v = bf16(v);
  for (float& v : wr) v = bf16(v);
  for (float& v : dyr) v = bf16(v);

  auto cpu = make_cpu_backend(1);
  std::vector<float> workspace(cpu->conv2d_workspace(s));
  std::vector<float> y_ref(y_size), dx_ref(x_size), dw_ref(w_size), db_ref(8);
  cpu->conv2d_forward(xr.data(), wr.data(), b.data(), y_ref.data(), workspace.data(), nullptr, s);
  cpu->conv2d_backward(xr.data(), wr.data(), dyr.data(), dx_ref.data(), dw_ref.data(),
                       db_ref.data(), workspace.data(), nullptr, s);

  cpu->set_precision(Precision::bf16);
  workspace.resize(cpu->conv2d_workspace(s));  // the bf16 GEMMs' im2col path needs one
  std::vector<float> y(y_size), dx(x_size), dw(w_size), db(8);
  cpu->conv2d_forward(x.data(), w.data(), b.data(), y.data(), workspace.data(), nullptr, s);
  cpu->conv2d_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                       workspace.data(), nullptr, s);
  auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      bad += std::abs(got[i] - want[i]) > 1e-4f * (1 + std::abs(want[i]));
    return bad;
  };
  CHECK(close(y, y_ref) == 0);
  CHECK(close(dx, dx_ref) == 0);
  CHECK(close(dw, dw_ref) == 0);
}

TEST_CASE("precision: fp16 is unavailable on the cpu, saying why; the default is fp32 only") {
  auto cpu = make_cpu_backend(1);
  CHECK(cpu->precision_unavailable(Precision::fp32).empty());
  const std::string why = cpu->precision_unavailable(Precision::fp16);
  CHECK(why.find("fp16") != std::string::npos);
  CHECK_THROWS_WITH_AS(cpu->set_precision(Precision::fp16),
                       doctest::Contains("train.precision=fp16 is not available on cpu"),
                       std::invalid_argument);
  testing::StagingBackend plain;  // no precision of its own: the interface's default
  CHECK_FALSE(plain.precision_unavailable(Precision::bf16).empty());
  CHECK_THROWS_AS(plain.set_precision(Precision::bf16), std::invalid_argument);
  plain.set_precision(Precision::fp32);
}

TEST_CASE("precision: all_finite finds an infinity or a NaN anywhere") {
  auto cpu = make_cpu_backend(1);
  testing::StagingBackend staging;
  for (Backend* backend : {cpu.get(), static_cast<Backend*>(&staging)}) {
    INFO(backend->name());
    DeviceMemory memory = backend->alloc(100 * sizeof(float));
    backend->fill(memory.data(), 1.5f, 100);
    CHECK(backend->all_finite(memory.data(), 100));
    for (const float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      backend->fill(memory.data() + 99, bad, 1);
      CHECK_FALSE(backend->all_finite(memory.data(), 100));
      CHECK(backend->all_finite(memory.data(), 99));
    }
  }
}

TEST_CASE(
    "loss scaler: PyTorch's schedule: x2 after 2000 finite steps, x0.5 and a skip on overflow") {
  MetricsRegistry registry;
  LossScaler scaler(registry);
  auto gauge = [&] { return series(registry, "pstrain_worker_loss_scale"); };
  CHECK(scaler.scale() == 65536.0f);
  CHECK(gauge() == 65536.0);
  for (int i = 0; i < 1999; ++i) REQUIRE(scaler.update(true));
  CHECK(scaler.scale() == 65536.0f);
  CHECK(scaler.update(true));  // the 2000th
  CHECK(scaler.scale() == 131072.0f);
  CHECK(gauge() == 131072.0);

  CHECK_FALSE(scaler.update(false));  // overflow: skipped, halved
  CHECK(scaler.scale() == 65536.0f);
  CHECK(scaler.skipped() == 1);
  CHECK(series(registry, "pstrain_worker_skipped_steps_total") == 1);
  // An overflow restarts the count of good steps.
  for (int i = 0; i < 1999; ++i) scaler.update(true);
  CHECK_FALSE(scaler.update(false));
  CHECK(scaler.scale() == 32768.0f);
  for (int i = 0; i < 1999; ++i) scaler.update(true);
  CHECK(scaler.scale() == 32768.0f);
  scaler.update(true);
  CHECK(scaler.scale() == 65536.0f);
  CHECK(scaler.skipped() == 2);
}

TEST_CASE("loss scaler: overflows in a row keep halving; options are honoured") {
  MetricsRegistry registry;
  LossScaler scaler(registry, {.initial = 8, .growth = 4, .backoff = 0.25, .growth_interval = 3});
  CHECK_FALSE(scaler.update(false));
  CHECK_FALSE(scaler.update(false));
  CHECK(scaler.scale() == 0.5f);
  scaler.update(true);
  scaler.update(true);
  CHECK(scaler.scale() == 0.5f);
  scaler.update(true);
  CHECK(scaler.scale() == 2.0f);
}
