#pragma once
// What the GPU tests (tests/gpu/test_*.cc) share: the backend and NCCL
// communicators from libpstrain_cuda.so, device buffers, a hold on the
// compute stream, comparisons against the double reference, the
// convolution paths, the low precisions, and the cases that need more
// devices than one.
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

namespace pstrain::gpu_test {

using pstrain::Backend;
using pstrain::ConvShape;
using pstrain::PoolShape;
namespace ref = pstrain::reference;

inline std::unique_ptr<Backend> make_backend(int device = 0) {
  std::array<char, 512> error{};
  std::unique_ptr<Backend> backend(pstrain_cuda_create_backend(device, error.data(), error.size()));
  if (!backend) throw std::runtime_error(error.data());
  return backend;
}

inline std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float lo = -1,
                                        float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

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
inline pstrain::HostMemory host_filled(Backend& b, std::size_t n, float value) {
  auto memory = b.alloc_host(n * sizeof(float));
  std::fill_n(memory.data(), n, value);
  return memory;
}

inline bool all_equal(const pstrain::HostMemory& memory, std::size_t n, float value) {
  const float* p = memory.data();
  return std::all_of(p, p + n, [&](float v) { return v == value; });
}

// Float results against the double reference: relative to the magnitude of
// the terms summed, which bounds float rounding (`scale`).
inline void check_close(const std::vector<float>& got, const std::vector<double>& want,
                        const char* what, double tolerance = 1e-4) {
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

// Whether the library finds a cuDNN it can use on this host (before the
// backend's probe): the conv cases then demand that it serves.
inline bool cudnn_usable() {
  std::array<char, 512> text{};
  const bool usable = pstrain_cudnn_status(text.data(), text.size()) == 1;
  MESSAGE("cuDNN: " << (usable ? "" : "not usable: ") << text.data());
  return usable;
}

inline std::string describe(const pstrain::PathCounts& paths) {
  std::string text;
  for (const auto& [path, count] : paths) text += path + " " + std::to_string(count) + "; ";
  return text;
}

// How often `path` ran between two path_counts().
inline std::uint64_t ran(const pstrain::PathCounts& before, const pstrain::PathCounts& after,
                         const std::string& path) {
  const auto at = [&](const pstrain::PathCounts& p) {
    const auto found = p.find(path);
    return found == p.end() ? std::uint64_t{0} : found->second;
  };
  return at(after) - at(before);
}

// Both convolution paths: cuDNN where it loads, and im2col + cuBLAS, which
// PSTRAIN_CUDNN_LIB=off selects for backends made while it is set.
inline std::unique_ptr<Backend> make_conv_backend(bool cudnn) {
  if (!cudnn) setenv("PSTRAIN_CUDNN_LIB", "off", 1);
  auto b = make_backend();
  if (!cudnn) unsetenv("PSTRAIN_CUDNN_LIB");
  MESSAGE("convolutions on " << b->name());
  if (!cudnn) CHECK(b->name().find("im2col convolutions") != std::string::npos);
  return b;
}

// Mixed precision (train.precision, client/compute/backend.h): a backend's GEMMs at
// bf16 and fp16 against the double reference on operands rounded with
// shared/low_precision.h, the rounding the CPU backend is tested with. Each
// precision the backend reports unavailable is skipped, saying why.
inline std::vector<double> rounded(const std::vector<float>& v, pstrain::HalfFormat format) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = pstrain::round_to_half(format, v[i]);
  return out;
}

inline std::vector<double> rounded(const std::vector<double>& v, pstrain::HalfFormat format) {
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
inline bool computes_at(Backend& b, pstrain::Precision p) {
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

inline std::unique_ptr<pstrain::Communicator> make_comm(Backend& backend,
                                                        const std::array<std::uint8_t, 128>& id,
                                                        int rank, int size) {
  std::array<char, 512> error{};
  std::unique_ptr<pstrain::Communicator> comm(pstrain_nccl_create(
      &backend, id.data(), id.size(), rank, size, 60.0, error.data(), error.size()));
  if (!comm) throw std::runtime_error(error.data());
  return comm;
}

inline std::array<std::uint8_t, 128> unique_id() {
  std::array<std::uint8_t, 128> id{};
  std::array<char, 512> error{};
  REQUIRE_MESSAGE(pstrain_nccl_unique_id(id.data(), id.size(), error.data(), error.size()) == 0,
                  error.data());
  return id;
}

// Cases that need more than one device, and how many: main() leaves them out
// on a host with fewer.
constexpr const char* kAllDevicesCase = "nccl across all devices of this host";
constexpr struct {
  const char* test_case;
  int devices;
} kNeedsDevices[] = {{kAllDevicesCase, 2}};

}  // namespace pstrain::gpu_test
