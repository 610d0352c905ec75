#include "client/compute/cpu/cpu_backend.h"

#include <cblas.h>
#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/compute/cpu/blas_core.h"
#include "client/compute/cpu/onednn_conv.h"
#include "client/compute/cpu/onednn_dense.h"
#include "client/compute/elementwise.h"
#include "shared/log.h"
#include "shared/low_precision.h"

// OpenBLAS's core selection (exported by its DYNAMIC_ARCH builds, not
// declared in cblas.h).
extern "C" {
void gotoblas_dynamic_init(void);
void gotoblas_dynamic_quit(void);
}

namespace pstrain {
namespace {

constexpr std::size_t kAlignment = 64;

// OpenBLAS reads OPENBLAS_CORETYPE only in its library constructor, before
// our code runs, so a better core than its own (client/compute/cpu/blas_core.h) is set
// there and its core selection run again, once per process and before any
// BLAS call of ours. The variable is unset again afterwards, so programs this
// one starts make their own choice rather than seeing it as the user's.
void choose_openblas_core() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string own = openblas_get_corename();
    const BlasCoreChoice choice =
        choose_blas_core(host_cpu_features(), own, std::getenv("OPENBLAS_CORETYPE"));
    if (!choice.core.empty()) {
      setenv("OPENBLAS_CORETYPE", choice.core.c_str(), 1);
      gotoblas_dynamic_quit();
      gotoblas_dynamic_init();
      unsetenv("OPENBLAS_CORETYPE");
    }
    log("openblas: core ", openblas_get_corename(), " (", choice.reason, ")");
  });
}

// OpenBLAS's bf16 GEMM. cblas.h declares it whatever the build, but only
// libraries built with BUILD_BFLOAT16 export it (Debian 12's do not), so it
// is looked up at run time; null when absent.
using Sbgemm = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint,
                        float, const bfloat16*, blasint, const bfloat16*, blasint, float, float*,
                        blasint);
Sbgemm find_sbgemm() {
  static const auto sbgemm = reinterpret_cast<Sbgemm>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  return sbgemm;
}

// oneDNN's bf16 matmul, where OpenBLAS has none, on CPUs with AVX512_BF16
// (float32 accumulation). A primitive is made once per GEMM shape (a model
// has a handful) and kept.
class OnednnBf16Gemm {
 public:
  OnednnBf16Gemm() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  // The implementation oneDNN runs bf16 matmuls with ("brg:avx512_core_bf16"),
  // or "" when it has only its reference code (slower than rounding the
  // operands for sgemm) or none.
  std::string implementation() {
    try {
      const std::string impl = gemm(false, false, 256, 256, 256, 256, 256, 0, 256).implementation;
      return impl.rfind("ref", 0) == 0 ? "" : impl;
    } catch (const dnnl::error&) {
      return "";
    }
  }

  // C = op(A) op(B) + beta C, row-major; A and B hold bf16 bit patterns.
  void run(bool ta, bool tb, int m, int n, int k, const std::uint16_t* a, int lda,
           const std::uint16_t* b, int ldb, float beta, float* c, int ldc) {
    Gemm& g = gemm(ta, tb, m, n, k, lda, ldb, beta, ldc);
    dnnl::memory am(g.a, engine_, const_cast<std::uint16_t*>(a));
    dnnl::memory bm(g.b, engine_, const_cast<std::uint16_t*>(b));
    dnnl::memory cm(g.c, engine_, c);
    g.matmul.execute(stream_, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream_.wait();
  }

 private:
  struct Gemm {
    dnnl::memory::desc a, b, c;
    dnnl::matmul matmul;
    std::string implementation;
  };

  Gemm& gemm(bool ta, bool tb, int m, int n, int k, int lda, int ldb, float beta, int ldc) {
    const std::array<int, 9> key{ta, tb, m, n, k, lda, ldb, ldc, std::bit_cast<int>(beta)};
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // A transposed operand is the same matrix read with swapped strides.
    const dnnl::memory::desc a({m, k}, dt::bf16, ta ? dims{1, lda} : dims{lda, 1});
    const dnnl::memory::desc b({k, n}, dt::bf16, tb ? dims{1, ldb} : dims{ldb, 1});
    const dnnl::memory::desc c({m, n}, dt::f32, dims{ldc, 1});
    dnnl::primitive_attr attr;
    if (beta != 0) {
      dnnl::post_ops sum;
      sum.append_sum(beta);
      attr.set_post_ops(sum);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
    return cache_.emplace(key, Gemm{a, b, c, dnnl::matmul(pd), pd.impl_info_str()}).first->second;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<std::array<int, 9>, Gemm> cache_;
};

// Samples per convolution chunk: the im2col matrix of one chunk plus its
// filter-major output stay within about 8 MiB, large enough for sgemm to run
// near its peak and small enough to stay in the last-level cache between
// im2col, the GEMM and the reorder.
constexpr std::size_t kConvChunkFloats = std::size_t{1} << 21;

int conv_chunk(const ConvShape& s) {
  const std::size_t per_sample = static_cast<std::size_t>(s.c * s.kernel * s.kernel + s.filters) *
                                 static_cast<std::size_t>(s.out_h() * s.out_w());
  return static_cast<int>(std::clamp<std::size_t>(kConvChunkFloats / per_sample, 1,
                                                  static_cast<std::size_t>(std::max(s.n, 1))));
}

// col[(ch*k + u)*k + v][i*P + r*ow + c] = x[i][ch][r+u][c+v] for the m samples
// at x: each row of `col` holds one kernel tap over all output positions of
// the chunk, so the forward product is one GEMM W[F x K] * col[K x m*P].
void im2col(const float* x, float* col, const ConvShape& s, int m) {
  const int k = s.kernel, oh = s.out_h(), ow = s.out_w();
  const std::size_t plane = static_cast<std::size_t>(s.h) * s.w;
  const std::size_t positions = static_cast<std::size_t>(oh) * ow;
  const std::size_t row_len = positions * m;
  for (int ch = 0; ch < s.c; ++ch) {
    for (int u = 0; u < k; ++u) {
      for (int v = 0; v < k; ++v) {
        float* dst = col + static_cast<std::size_t>((ch * k + u) * k + v) * row_len;
        for (int i = 0; i < m; ++i) {
          const float* src = x + (static_cast<std::size_t>(i) * s.c + ch) * plane +
                             static_cast<std::size_t>(u) * s.w + v;
          for (int r = 0; r < oh; ++r) {
            std::memcpy(dst, src + static_cast<std::size_t>(r) * s.w, sizeof(float) * ow);
            dst += ow;
          }
        }
      }
    }
  }
}

// The adjoint of im2col: dx[i][ch][r+u][c+v] += col[...]; dx is overwritten.
void col2im(const float* col, float* dx, const ConvShape& s, int m) {
  const int k = s.kernel, oh = s.out_h(), ow = s.out_w();
  const std::size_t plane = static_cast<std::size_t>(s.h) * s.w;
  const std::size_t row_len = static_cast<std::size_t>(oh) * ow * m;
  std::fill_n(dx, plane * s.c * m, 0.0f);
  for (int ch = 0; ch < s.c; ++ch) {
    for (int u = 0; u < k; ++u) {
      for (int v = 0; v < k; ++v) {
        const float* src = col + static_cast<std::size_t>((ch * k + u) * k + v) * row_len;
        for (int i = 0; i < m; ++i) {
          float* dst = dx + (static_cast<std::size_t>(i) * s.c + ch) * plane +
                       static_cast<std::size_t>(u) * s.w + v;
          for (int r = 0; r < oh; ++r) {
            float* out = dst + static_cast<std::size_t>(r) * s.w;
            for (int c = 0; c < ow; ++c) out[c] += src[c];
            src += ow;
          }
        }
      }
    }
  }
}

// Max pooling over every plane; K > 0 fixes the window size at compile
// time, K == 0 takes it from the shape. Taps go in row-major order and only a
// strictly larger value wins, as ew::argmax does; selects rather than
// branches, since the winner's position in real activations is unpredictable.
// oneDNN's max pooling picks the same winners but was slower on the CNN's
// NCHW planes: for 64x32x26x26, its primitive alone took 4.8 ms (best of
// three), this loop 2.7 ms with the argmax, which oneDNN gives as window
// offsets that would still need turning into flat indices.
template <int K>
void maxpool_planes(const float* x, float* y, std::int32_t* argmax, const PoolShape& s) {
  const int k = K > 0 ? K : s.k;
  const int w = s.w, oh = s.out_h(), ow = s.out_w();
  const std::size_t plane = static_cast<std::size_t>(s.h) * w;
  const std::size_t planes = static_cast<std::size_t>(s.n) * s.c;
  for (std::size_t pl = 0; pl < planes; ++pl) {
    const float* __restrict in = x + pl * plane;
    const auto base = static_cast<std::int32_t>(pl * plane);
    for (int r = 0; r < oh; ++r) {
      float* __restrict out = y + (pl * oh + r) * ow;
      std::int32_t* __restrict arg = argmax + (pl * oh + r) * ow;
      for (int c = 0; c < ow; ++c) {
        int best = r * k * w + c * k;
        float value = in[best];
        for (int u = 0; u < k; ++u) {
          for (int v = 0; v < k; ++v) {
            const int tap = (r * k + u) * w + c * k + v;
            const bool wins = ew::takes_max(in[tap], value);
            value = wins ? in[tap] : value;
            best = wins ? tap : best;
          }
        }
        out[c] = value;
        arg[c] = base + best;
      }
    }
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, CpuKernels kernels) : threads_(threads) {
    if (threads < 1) {
      throw std::invalid_argument("cpu backend: threads must be >= 1, got " +
                                  std::to_string(threads));
    }
    choose_openblas_core();
    openblas_set_num_threads(threads);
    if (kernels == CpuKernels::onednn) {
      conv_ = std::make_unique<OnednnConv>(threads);
      dense_ = std::make_unique<OnednnDense>(threads);
    }
  }

  std::string name() const override {
    return "cpu (OpenBLAS " + std::string(openblas_get_corename()) +
           (conv_ ? ", oneDNN" : ", OpenBLAS") + " kernels, " + std::to_string(threads_) +
           (threads_ == 1 ? " thread)" : " threads)");
  }
  bool host_accessible() const override { return true; }
  PathCounts path_counts() const override { return paths_; }

  DeviceMemory alloc(std::size_t bytes) override {
    return DeviceMemory(this, allocate(bytes), bytes);
  }
  HostMemory alloc_host(std::size_t bytes) override {
    return HostMemory(this, allocate(bytes), bytes);
  }
  void release(void* device_ptr) noexcept override { std::free(device_ptr); }
  void release_host(void* host_ptr) noexcept override { std::free(host_ptr); }

  void upload(const void* host, void* device, std::size_t bytes) override {
    std::memcpy(device, host, bytes);
  }
  void download(const void* device, void* host, std::size_t bytes) override {
    std::memcpy(host, device, bytes);
  }
  void fill(float* device, float value, std::size_t n) override { std::fill_n(device, n, value); }

  Fence fence() override { return ++fences_; }
  bool fence_done(Fence) override { return true; }
  void wait(Fence) override {}

  void dense_forward(const float* x, const float* w, const float* b, float* y, int n, int in,
                     int out) override {
    ++paths_[onednn_dense() ? "dense onednn" : "dense gemm"];
    if (OnednnDense* dense = onednn_dense()) return dense->forward(x, w, b, y, n, in, out);
    for (int i = 0; i < n; ++i) {
      std::copy_n(b, out, y + static_cast<std::size_t>(i) * out);
    }
    gemm(CblasNoTrans, CblasNoTrans, n, out, in, x, in, w, out, 1.0f, y, out);
  }

  void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, int n, int in, int out) override {
    ++paths_[onednn_dense() ? "dense onednn" : "dense gemm"];
    std::fill_n(db, out, 0.0f);
    for (int i = 0; i < n; ++i) {
      const float* row = dy + static_cast<std::size_t>(i) * out;
      for (int o = 0; o < out; ++o) db[o] += row[o];
    }
    if (OnednnDense* dense = onednn_dense()) return dense->backward(x, w, dy, dx, dw, n, in, out);
    gemm(CblasTrans, CblasNoTrans, in, out, n, x, in, dy, out, 0.0f, dw, out);
    if (dx) {
      gemm(CblasNoTrans, CblasTrans, n, in, out, dy, out, w, out, 0.0f, dx, in);
    }
  }

  void relu_forward(const float* x, float* y, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) y[i] = ew::relu(x[i]);
  }
  void relu_backward(const float* y, const float* dy, float* dx, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) dx[i] = ew::relu_grad(y[i], dy[i]);
  }

  // The im2col matrix (K x m*P) and the filter-major output or gradient
  // (F x m*P) of one chunk.
  // oneDNN keeps the buffers of its own layouts and needs none.
  std::size_t conv2d_workspace(const ConvShape& s) const override {
    if (onednn_conv()) return 0;
    return static_cast<std::size_t>(s.c * s.kernel * s.kernel + s.filters) *
           static_cast<std::size_t>(s.out_h() * s.out_w()) * conv_chunk(s);
  }

  std::size_t conv2d_columns(const ConvShape& s) const override {
    if (onednn_conv()) return 0;
    return conv2d_im2col_columns(s);
  }

  // With `columns`, each chunk's im2col matrix goes to its place in the
  // matrix of the whole batch there rather than to the workspace.
  void conv2d_forward(const float* x, const float* w, const float* b, float* y, float* workspace,
                      float* columns, const ConvShape& s) override {
    ++paths_[onednn_conv() ? "conv2d onednn" : "conv2d im2col"];
    if (OnednnConv* conv = onednn_conv()) return conv->forward(x, w, b, y, s);
    const int kk = s.c * s.kernel * s.kernel;
    const std::size_t positions = static_cast<std::size_t>(s.out_h()) * s.out_w();
    const int chunk = conv_chunk(s);
    float* out = workspace + static_cast<std::size_t>(kk) * positions * chunk;
    for (int n0 = 0; n0 < s.n; n0 += chunk) {
      const int m = std::min(chunk, s.n - n0);
      const int cols = static_cast<int>(positions) * m;
      float* col = columns ? columns + static_cast<std::size_t>(kk) * positions * n0 : workspace;
      im2col(x + static_cast<std::size_t>(n0) * s.c * s.h * s.w, col, s, m);
      gemm(CblasNoTrans, CblasNoTrans, s.filters, cols, kk, w, kk, col, cols, 0.0f, out, cols);
      // Filter-major to NCHW, adding the bias on the way.
      for (int f = 0; f < s.filters; ++f) {
        const float* src = out + static_cast<std::size_t>(f) * cols;
        for (int i = 0; i < m; ++i) {
          float* dst = y + (static_cast<std::size_t>(n0 + i) * s.filters + f) * positions;
          const float* part = src + static_cast<std::size_t>(i) * positions;
          for (std::size_t p = 0; p < positions; ++p) dst[p] = part[p] + b[f];
        }
      }
    }
  }

  // With `columns`, the kept matrix feeds the weight gradient and the
  // column gradients go to the workspace, leaving the matrix as it was.
  void conv2d_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, float* workspace, const float* columns,
                       const ConvShape& s) override {
    ++paths_[onednn_conv() ? "conv2d onednn" : "conv2d im2col"];
    if (OnednnConv* conv = onednn_conv()) return conv->backward(x, w, dy, dx, dw, db, s);
    const int kk = s.c * s.kernel * s.kernel;
    const std::size_t positions = static_cast<std::size_t>(s.out_h()) * s.out_w();
    const std::size_t image = static_cast<std::size_t>(s.c) * s.h * s.w;
    const int chunk = conv_chunk(s);
    float* col = workspace;
    float* grad = workspace + static_cast<std::size_t>(kk) * positions * chunk;
    std::fill_n(db, s.filters, 0.0f);
    for (int n0 = 0; n0 < s.n; n0 += chunk) {
      const int m = std::min(chunk, s.n - n0);
      const int cols = static_cast<int>(positions) * m;
      // NCHW to filter-major, summing the bias gradient on the way.
      for (int f = 0; f < s.filters; ++f) {
        float* dst = grad + static_cast<std::size_t>(f) * cols;
        float sum = 0.0f;
        for (int i = 0; i < m; ++i) {
          const float* src = dy + (static_cast<std::size_t>(n0 + i) * s.filters + f) * positions;
          float* part = dst + static_cast<std::size_t>(i) * positions;
          for (std::size_t p = 0; p < positions; ++p) {
            part[p] = src[p];
            sum += src[p];
          }
        }
        db[f] += sum;
      }
      const float* matrix = col;
      if (columns) {
        matrix = columns + static_cast<std::size_t>(kk) * positions * n0;
      } else {
        im2col(x + static_cast<std::size_t>(n0) * image, col, s, m);
      }
      gemm(CblasNoTrans, CblasTrans, s.filters, kk, cols, grad, cols, matrix, cols,
           n0 == 0 ? 0.0f : 1.0f, dw, kk);
      if (dx) {
        // The workspace's im2col matrix, if any, has been consumed: the
        // column gradients take its place.
        gemm(CblasTrans, CblasNoTrans, kk, cols, s.filters, w, kk, grad, cols, 0.0f, col, cols);
        col2im(col, dx + static_cast<std::size_t>(n0) * image, s, m);
      }
    }
  }

  void maxpool_forward(const float* x, float* y, std::int32_t* argmax,
                       const PoolShape& s) override {
    // The 2x2 window of every CNN here gets a compile-time size, so its
    // taps unroll into selects and the loop over the row vectorises.
    if (s.k == 2) {
      maxpool_planes<2>(x, y, argmax, s);
    } else {
      maxpool_planes<0>(x, y, argmax, s);
    }
  }

  void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx,
                        const PoolShape& s) override {
    std::fill_n(dx, static_cast<std::size_t>(s.n) * s.c * s.h * s.w, 0.0f);
    const std::size_t outputs = static_cast<std::size_t>(s.n) * s.c * s.out_h() * s.out_w();
    for (std::size_t j = 0; j < outputs; ++j) dx[argmax[j]] = dy[j];
  }

  void softmax_xent(const float* logits, const std::int32_t* labels, float* dlogits, float* loss,
                    float* correct, int n, int classes) override {
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int i = 0; i < n; ++i) {
      const std::int32_t label = labels[i];
      if (label < 0 || label >= classes) {
        throw std::invalid_argument("softmax_xent: label " + std::to_string(label) + " of sample " +
                                    std::to_string(i) + " is not in [0, " +
                                    std::to_string(classes) + ")");
      }
      const float* row = logits + static_cast<std::size_t>(i) * classes;
      float* grad = dlogits + static_cast<std::size_t>(i) * classes;
      const int best = ew::argmax(row, classes);
      float sum = 0.0f;
      for (int j = 0; j < classes; ++j) sum += ew::softmax_exp_term(row[j], row[best]);
      const float lse = ew::log_sum_exp(row[best], sum);
      for (int j = 0; j < classes; ++j) {
        grad[j] = ew::xent_grad(row[j], lse, j == label, inv_n);
      }
      loss[i] = ew::xent_loss(row[label], lse);
      correct[i] = ew::correct(best, label);
    }
  }

  void bce_logits(const float* logits, const std::int32_t* labels, float* dlogits, float* loss,
                  float* correct, int n) override {
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int i = 0; i < n; ++i) {
      if (labels[i] != 0 && labels[i] != 1)
        throw std::invalid_argument("bce_logits: label " + std::to_string(labels[i]) +
                                    " of sample " + std::to_string(i) + " is not 0 or 1");
      dlogits[i] = ew::bce_grad(logits[i], labels[i], inv_n);
      loss[i] = ew::bce_loss(logits[i], labels[i]);
      correct[i] = ew::bce_correct(logits[i], labels[i]);
    }
  }

  void dot_interaction_forward(const float* x, float* y, const InteractionShape& s) override {
    for (int i = 0; i < s.n; ++i) {
      const float* row = x + static_cast<std::size_t>(i) * s.in_width();
      float* out = y + static_cast<std::size_t>(i) * s.out_width();
      std::copy_n(row, s.keep, out);
      for (int a = 0; a < s.vectors; ++a)
        for (int b = a + 1; b < s.vectors; ++b)
          out[s.keep + ew::interaction_pair(a, b, s.vectors)] =
              ew::interaction_dot(row, s.dim, a, b);
    }
  }

  void dot_interaction_backward(const float* x, const float* dy, float* dx,
                                const InteractionShape& s) override {
    for (int i = 0; i < s.n; ++i) {
      const float* row = x + static_cast<std::size_t>(i) * s.in_width();
      const float* grad = dy + static_cast<std::size_t>(i) * s.out_width();
      float* out = dx + static_cast<std::size_t>(i) * s.in_width();
      for (int v = 0; v < s.vectors; ++v)
        for (int j = 0; j < s.dim; ++j)
          out[v * s.dim + j] = ew::interaction_grad(row, grad, s.vectors, s.dim, s.keep, v, j);
    }
  }

  void scale(float* x, float a, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) x[i] *= a;
  }

  void embedding_forward(const float* rows, const std::int32_t* inverse, float* out,
                         const EmbeddingShape& s) override {
    const float scale = ew::pool_scale(s.k, s.mean);
    for (int i = 0; i < s.n; ++i) {
      float* o = out + static_cast<std::size_t>(i) * s.stride;
      if (s.bag) std::fill_n(o, s.dim, 0.0f);
      for (int t = 0; t < s.k; ++t) {
        const float* r = rows + static_cast<std::size_t>(inverse[i * s.k + t]) * s.dim;
        if (s.bag) {
          for (int j = 0; j < s.dim; ++j) o[j] += r[j];
        } else {
          std::copy_n(r, s.dim, o + static_cast<std::size_t>(t) * s.dim);
        }
      }
      if (s.bag)
        for (int j = 0; j < s.dim; ++j) o[j] *= scale;
    }
  }

  void embedding_backward(const float* dout, const std::int32_t* by_row,
                          const std::int32_t* offsets, float* drows,
                          const EmbeddingShape& s) override {
    const float scale = s.bag ? ew::pool_scale(s.k, s.mean) : 1.0f;
    for (int u = 0; u < s.unique; ++u) {
      float* d = drows + static_cast<std::size_t>(u) * s.dim;
      std::fill_n(d, s.dim, 0.0f);
      for (std::int32_t o = offsets[u]; o < offsets[u + 1]; ++o)
        for (int j = 0; j < s.dim; ++j)
          d[j] += dout[ew::embedding_column(by_row[o], j, s.k, s.dim, s.stride, s.bag)];
      for (int j = 0; j < s.dim; ++j) d[j] *= scale;
    }
  }

  void copy_columns(const float* src, std::size_t src_stride, float* dst, std::size_t dst_stride,
                    std::size_t rows, std::size_t cols) override {
    for (std::size_t r = 0; r < rows; ++r)
      std::copy_n(src + r * src_stride, cols, dst + r * dst_stride);
  }

  void axpby(float a, const float* x, float b, float* y, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) y[i] = ew::axpby(a, x[i], b, y[i]);
  }

  // bf16 always: through cblas_sbgemm where OpenBLAS exports it, else
  // oneDNN's matmul on CPUs with AVX512_BF16, else the operands rounded to
  // bf16 go through sgemm, which gives the same numbers (products of two bf16
  // values are exact in float32) without the speed. Without AVX512_BF16,
  // oneDNN 2.6 emulates bf16 (gemm:jit) at 0.4x sgemm's speed for the MLP,
  // slower than the rounding (0.5x), so it is not used there.
  std::string precision_unavailable(Precision p) const override {
    if (p != Precision::fp16) return "";
    return "OpenBLAS has no fp16 GEMM (train.precision=bf16 is the CPU's low precision)";
  }

  void set_precision(Precision p) override {
    Backend::set_precision(p);
    if (p == Precision::bf16 && p != precision_) {
      std::string how;
      if (find_sbgemm()) {
        how = "through OpenBLAS cblas_sbgemm";
      } else if (host_cpu_features().avx512bf16) {
        if (!bf16_matmul_) {
          // oneDNN's threads are OpenMP's: as many as OpenBLAS's.
          if (const auto set_threads =
                  reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads")))
            set_threads(threads_);
          bf16_matmul_.emplace();
        }
        const std::string impl = bf16_matmul_->implementation();
        if (impl.empty()) bf16_matmul_.reset();
        if (bf16_matmul_) how = "through oneDNN matmul (" + impl + ")";
      }
      if (how.empty())
        how =
            "emulated: operands rounded to bf16, float32 sgemm (no cblas_sbgemm in this OpenBLAS, "
            "no native oneDNN bf16 matmul on this CPU): bf16 results without a speed-up";
      log("cpu: bf16 GEMMs ", how);
    }
    precision_ = p;
  }

  void apply_optimizer(const OptimizerConfig& config, float* w, const float* g, float* state,
                       std::size_t n, std::uint64_t step, float lr_scale) override {
    const Optimizer optimizer(config);
    optimizer.apply(std::span<float>(w, n), std::span<const float>(g, n),
                    std::span<float>(state, n * optimizer.state_slots()), step, lr_scale);
  }

 private:
  static void* allocate(std::size_t bytes) {
    // aligned_alloc wants a multiple of the alignment, and a zero-byte
    // request must still give a pointer distinct from "none".
    const std::size_t rounded =
        std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    void* ptr = std::aligned_alloc(kAlignment, rounded);
    if (!ptr) throw std::bad_alloc();
    return ptr;
  }

  // C = op(A) op(B) + beta C at the chosen precision; A and B are read as
  // stored, rows x ld floats.
  void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) {
    if (precision_ == Precision::fp32) {
      cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    const std::size_t a_size = static_cast<std::size_t>(ta == CblasNoTrans ? m : k) * lda;
    const std::size_t b_size = static_cast<std::size_t>(tb == CblasNoTrans ? k : n) * ldb;
    const Sbgemm sbgemm = find_sbgemm();
    if (sbgemm || bf16_matmul_) {
      half_a_.resize(a_size);
      half_b_.resize(b_size);
      encode_halves(HalfFormat::bf16, a, half_a_.data(), a_size);
      encode_halves(HalfFormat::bf16, b, half_b_.data(), b_size);
      if (sbgemm)
        sbgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, half_a_.data(), lda, half_b_.data(), ldb, beta,
               c, ldc);
      else
        bf16_matmul_->run(ta == CblasTrans, tb == CblasTrans, m, n, k, half_a_.data(), lda,
                          half_b_.data(), ldb, beta, c, ldc);
      return;
    }
    rounded_a_.resize(a_size);
    rounded_b_.resize(b_size);
    for (std::size_t i = 0; i < a_size; ++i) rounded_a_[i] = round_to_half(HalfFormat::bf16, a[i]);
    for (std::size_t i = 0; i < b_size; ++i) rounded_b_[i] = round_to_half(HalfFormat::bf16, b[i]);
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, rounded_a_.data(), lda, rounded_b_.data(),
                ldb, beta, c, ldc);
  }

  // oneDNN's kernels where they apply: null with OpenBLAS kernels and at the
  // low precisions, which go through gemm() below.
  OnednnConv* onednn_conv() const { return precision_ == Precision::fp32 ? conv_.get() : nullptr; }
  OnednnDense* onednn_dense() const {
    return precision_ == Precision::fp32 ? dense_.get() : nullptr;
  }

  int threads_;
  // Both null with OpenBLAS kernels (onednn_conv, onednn_dense).
  std::unique_ptr<OnednnConv> conv_;
  std::unique_ptr<OnednnDense> dense_;
  Fence fences_ = 0;
  PathCounts paths_;
  Precision precision_ = Precision::fp32;
  std::optional<OnednnBf16Gemm> bf16_matmul_;  // bf16 without cblas_sbgemm, where oneDNN has one
  // Rounded operands of the low-precision GEMMs, kept between calls.
  std::vector<std::uint16_t> half_a_, half_b_;
  std::vector<float> rounded_a_, rounded_b_;
};

}  // namespace

CpuKernels cpu_kernels_from_env() {
  const char* value = std::getenv("PSTRAIN_CPU_KERNELS");
  const std::string choice = value ? value : "";
  if (choice.empty() || choice == "onednn") return CpuKernels::onednn;
  if (choice == "openblas") return CpuKernels::openblas;
  throw std::invalid_argument("PSTRAIN_CPU_KERNELS=" + choice + ": expected onednn or openblas");
}

std::unique_ptr<Backend> make_cpu_backend(int threads, CpuKernels kernels) {
  return std::make_unique<CpuBackend>(threads, kernels);
}

}  // namespace pstrain
