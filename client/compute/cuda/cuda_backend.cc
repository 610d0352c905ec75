// The CUDA backend's ops: memory, transfers, cuBLAS GEMMs and kernel
// launches, each bracketed by StreamOrder so that issue order holds across
// the two streams.
#include "client/compute/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "client/compute/cuda/step_graph.h"

namespace pstrain::cuda {
namespace {

// The im2col buffers of one convolution chunk; bounds the workspace at large
// batches (the GEMMs are already large enough to fill the GPU well before).
constexpr std::size_t kConvWorkspaceFloats = std::size_t{1} << 24;

// How long releases wait for queued work: far longer than any op of a
// training step runs, and as long as a collective may hang before the NCCL
// watchdog (default timeout 60 s) aborts it.
constexpr double kReleaseTimeoutS = 90;

void check_conv(const ConvShape& s, const char* op) {
  check_dims(s.n > 0 && s.c > 0 && s.filters > 0 && s.kernel > 0 && s.out_h() > 0 && s.out_w() > 0,
             op, "invalid shape " + to_string(s));
}

void check_pool(const PoolShape& s, const char* op) {
  check_dims(s.n > 0 && s.c > 0 && s.k > 0 && s.out_h() > 0 && s.out_w() > 0, op,
             "invalid shape n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) + " h=" +
                 std::to_string(s.h) + " w=" + std::to_string(s.w) + " k=" + std::to_string(s.k));
}

// `device` if it is one of the visible devices.
int existing_device(int device) {
  int count = 0;
  PSTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    throw std::invalid_argument("cuda backend: device " + std::to_string(device) +
                                " does not exist (" + std::to_string(count) +
                                " visible device(s))");
  }
  return device;
}

void check_range(const void* base, std::size_t size, const void* p, std::size_t bytes,
                 const char* op) {
  const auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(p) -
                                               static_cast<const std::byte*>(base));
  check_dims(offset + bytes <= size, op,
             std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                 " overrun an allocation of " + std::to_string(size) + " bytes");
}

}  // namespace

// ---- construction --------------------------------------------------------

CudaBackend::CudaBackend(int device) : device_(existing_device(device)), order_(device_) {
  const DeviceScope scope(device_);
  cudaDeviceProp prop{};
  PSTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  sm_count_ = prop.multiProcessorCount;
  compute_capability_ = prop.major * 10 + prop.minor;
  name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ", sm_" +
          std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  cublas_ = make_cublas(order_.compute_stream());
  cublas_workspace_ = device_buffer<std::byte>(kCublasWorkspaceBytes);
  PSTRAIN_CUDA_CHECK(
      cublasSetWorkspace(cublas_.get(), cublas_workspace_.get(), kCublasWorkspaceBytes));
  lt_ = std::make_unique<LtDense>(order_.compute_stream());
  std::string why_not;
  cudnn_ = CudnnConvolutions::make(order_.compute_stream(), why_not);
  if (cudnn_) {
    name_.insert(name_.size() - 1, ", cuDNN " + cudnn_->version());
  } else {
    name_.insert(name_.size() - 1, ", im2col convolutions");
    std::fprintf(stderr, "pstrain cuda: cuDNN not used (%s): convolutions take the im2col path\n",
                 why_not.c_str());
  }
}

CudaBackend::~CudaBackend() {
  // Pinned host buffers and device memory may still be in use by queued
  // copies and kernels, and cuBLAS's destroy synchronizes the device: drain
  // both streams first. When they do not drain in time, the memory and the
  // handle are leaked rather than freed under running work or waited for
  // forever.
  try {
    const DeviceScope scope(device_);
    if (order_.drain(kReleaseTimeoutS)) {
      device_allocations_.clear();
      host_allocations_.clear();
      half_operands_.reset();
      lt_.reset();
      nonfinite_.reset();
      nonfinite_host_.reset();
      cudnn_.reset();
      cublas_.reset();
      cublas_workspace_.reset();
      return;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstrain cuda: %s\n", e.what());
  }
  std::fprintf(stderr, "pstrain cuda: %s: leaking %zu device and %zu pinned buffers in use\n",
               name_.c_str(), device_allocations_.size(), host_allocations_.size());
  for (auto& [p, memory] : device_allocations_) (void)memory.release();
  for (auto& [p, memory] : host_allocations_) (void)memory.release();
  (void)cublas_.release();
  (void)cublas_workspace_.release();
  (void)cudnn_.release();
  (void)half_operands_.release();
  if (lt_) (void)lt_->workspace().release();
  (void)lt_.release();
  (void)nonfinite_.release();
  (void)nonfinite_host_.release();
}

// ---- memory --------------------------------------------------------------

DeviceMemory CudaBackend::alloc(std::size_t bytes) {
  if (bytes == 0) return {};
  const DeviceScope scope(device_);
  auto memory = device_buffer<std::byte>(bytes);
  void* p = memory.get();
  device_allocations_.emplace(p, std::move(memory));
  order_.track(p, bytes);
  return DeviceMemory(this, p, bytes);
}

HostMemory CudaBackend::alloc_host(std::size_t bytes) {
  if (bytes == 0) return {};
  const DeviceScope scope(device_);
  auto memory = pinned_buffer<std::byte>(bytes);
  void* p = memory.get();
  host_allocations_.emplace(p, std::move(memory));
  return HostMemory(this, p, bytes);
}

void CudaBackend::release(void* device_ptr) noexcept {
  order_.untrack(device_ptr);
  auto node = device_allocations_.extract(device_ptr);
  if (!node.empty()) free_when_idle(node.mapped());
}

void CudaBackend::release_host(void* host_ptr) noexcept {
  auto node = host_allocations_.extract(host_ptr);
  if (!node.empty()) free_when_idle(node.mapped());
}

// cudaFree and cudaFreeHost wait for the whole device, so a kernel that never
// ends (a collective whose peer died, until its watchdog aborts it) would
// block them forever: the streams are drained under a deadline first, with
// this backend's device current (a process may drive several), and memory
// still in use when it passes is leaked rather than freed.
template <class Buffer>
void CudaBackend::free_when_idle(Buffer& buffer) noexcept {
  try {
    const DeviceScope scope(device_);
    if (order_.drain(kReleaseTimeoutS)) return buffer.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstrain cuda: %s\n", e.what());
  }
  std::fprintf(stderr, "pstrain cuda: %s: leaking a buffer its queued work may still use\n",
               name_.c_str());
  (void)buffer.release();
}

// The step graphs' buffers (step_graph.cc).
template void CudaBackend::free_when_idle(DeviceBuffer<std::byte>&) noexcept;
template void CudaBackend::free_when_idle(DeviceBuffer<kernels::LiveStep>&) noexcept;

// ---- transfers -----------------------------------------------------------

void CudaBackend::upload(const void* host, void* device, std::size_t bytes) {
  transfer(device, host, device, bytes, cudaMemcpyHostToDevice, "upload");
}

void CudaBackend::download(const void* device, void* host, std::size_t bytes) {
  transfer(host, device, device, bytes, cudaMemcpyDeviceToHost, "download");
}

void CudaBackend::transfer(void* to, const void* from, const void* device, std::size_t bytes,
                           cudaMemcpyKind kind, const char* op) {
  if (bytes == 0) return;
  check_dims(!capturing_, op, "a step graph cannot record transfers");
  const DeviceScope scope(device_);
  if (const auto a = order_.allocation_of(device))
    check_range(a->base, a->bytes, device, bytes, op);
  order_.before_copy(device);
  try {
    PSTRAIN_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, kind, order_.copy_stream()));
  } catch (...) {
    // The copy stream already waits for the buffer's side work, which later
    // compute must learn through the copy's record.
    order_.after_copy(device);
    throw;
  }
  order_.after_copy(device);
}

// ---- fences --------------------------------------------------------------

Backend::Fence CudaBackend::fence() {
  check_dims(!capturing_, "fence", "a step graph cannot record fences");
  return order_.fence();
}
bool CudaBackend::fence_done(Fence fence) { return order_.fence_done(fence); }
void CudaBackend::wait(Fence fence) { order_.wait(fence); }

void CudaBackend::hold_compute(const std::int32_t* host_flag) {
  const DeviceScope scope(device_);
  void* flag = nullptr;
  PSTRAIN_CUDA_CHECK(cudaHostGetDevicePointer(&flag, const_cast<std::int32_t*>(host_flag), 0));
  compute({}, [&](cudaStream_t s) {
    kernels::hold(on(s), static_cast<const std::int32_t*>(flag), 60'000'000'000ull);
  });
}

void CudaBackend::fill(float* device, float value, std::size_t n) {
  if (n == 0) return;
  compute({device}, [&](cudaStream_t s) { kernels::fill(on(s), device, value, n); });
}

// ---- math ----------------------------------------------------------------

// Row-major C[m x n] = op(A) op(B) (+ beta C) through column-major cuBLAS:
// a row-major matrix is its transpose in column-major, so compute
// C^T = op(B)^T op(A)^T with the operands swapped.
void CudaBackend::gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                       const float* b, float beta, float* c) {
  const float alpha = 1.0f;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ld_a = trans_a ? m : k, ld_b = trans_b ? k : n;
  if (precision_ == Precision::fp32) {
    PSTRAIN_CUDA_CHECK(
        cublasSgemm(cublas_.get(), op_b, op_a, n, m, k, &alpha, b, ld_b, a, ld_a, &beta, c, n));
    return;
  }
  // Operands rounded as the CPU rounds them (shared/low_precision.h), then a
  // tensor-core GEMM on them with float32 accumulation.
  const std::size_t size_a = std::size_t(m) * k, size_b = std::size_t(k) * n;
  if (half_capacity_ < size_a + size_b) {
    // Unreachable through make_step_graph, which refuses these precisions:
    // a capture cannot allocate, and a graph keeps the old scratch's address.
    check_dims(!capturing_, "gemm", "a step graph cannot grow the half-precision scratch");
    if (half_operands_) free_when_idle(half_operands_);  // queued GEMMs may read it
    half_capacity_ = 0;                                  // until the new buffer is there
    half_operands_ = device_buffer<std::uint16_t>(size_a + size_b);
    half_capacity_ = size_a + size_b;
  }
  const HalfFormat format = precision_ == Precision::bf16 ? HalfFormat::bf16 : HalfFormat::fp16;
  const cudaDataType_t type = precision_ == Precision::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  std::uint16_t* half_a = half_operands_.get();
  std::uint16_t* half_b = half_a + size_a;
  kernels::encode_halves(on(order_.compute_stream()), format, a, half_a, size_a);
  kernels::encode_halves(on(order_.compute_stream()), format, b, half_b, size_b);
  PSTRAIN_CUDA_CHECK(cublasGemmEx(cublas_.get(), op_b, op_a, n, m, k, &alpha, half_b, type, ld_b,
                                  half_a, type, ld_a, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

std::string CudaBackend::precision_unavailable(Precision p) const {
  if (p == Precision::bf16 && compute_capability_ < 80)
    return name_ + ": bf16 GEMMs need compute capability 8.0 or higher";
  return "";
}

void CudaBackend::set_precision(Precision p) {
  if (const std::string why = precision_unavailable(p); !why.empty())
    throw std::invalid_argument(why);
  check_dims(p == Precision::fp32 || step_graphs_ == 0, "set_precision",
             "step graphs exist, and they record fp32 steps only");
  precision_ = p;
}

bool CudaBackend::all_finite(const float* x, std::size_t n) {
  if (n == 0) return true;
  if (!nonfinite_) {
    const DeviceScope scope(device_);
    nonfinite_ = device_buffer<int>(1);
    nonfinite_host_ = pinned_buffer<int>(1);
  }
  // Flag and download on the compute stream, behind the work that wrote x.
  compute({x}, [&](cudaStream_t s) {
    PSTRAIN_CUDA_CHECK(cudaMemsetAsync(nonfinite_.get(), 0, sizeof(int), s));
    kernels::flag_nonfinite(on(s), x, n, nonfinite_.get());
    PSTRAIN_CUDA_CHECK(cudaMemcpyAsync(nonfinite_host_.get(), nonfinite_.get(), sizeof(int),
                                       cudaMemcpyDeviceToHost, s));
  });
  synchronize();
  return nonfinite_host_[0] == 0;
}

void CudaBackend::dense_forward(const float* x, const float* w, const float* b, float* y, int n,
                                int in, int out) {
  check_dims(n > 0 && in > 0 && out > 0, "dense_forward",
             "n, in and out must be positive (got " + std::to_string(n) + ", " +
                 std::to_string(in) + ", " + std::to_string(out) + ")");
  compute({x, w, b, y}, [&](cudaStream_t s) {
    if (precision_ == Precision::fp32) {
      if (lt_->forward(x, w, b, y, n, in, out)) return count_path("dense cublaslt");
      count_path("dense cublaslt refused");
    }
    count_path("dense cublas");
    kernels::broadcast_rows(on(s), b, y, n, out);
    gemm(false, false, n, out, in, x, w, 1.0f, y);
  });
}

void CudaBackend::dense_backward(const float* x, const float* w, const float* dy, float* dx,
                                 float* dw, float* db, int n, int in, int out) {
  check_dims(n > 0 && in > 0 && out > 0, "dense_backward",
             "n, in and out must be positive (got " + std::to_string(n) + ", " +
                 std::to_string(in) + ", " + std::to_string(out) + ")");
  compute({x, w, dy, dx, dw, db}, [&](cudaStream_t s) {
    bool fused = false;
    if (precision_ == Precision::fp32) {
      fused = lt_->weight_grad(x, dy, dw, db, n, in, out);
      count_path(fused ? "dense cublaslt" : "dense cublaslt refused");
    }
    if (!fused) {
      count_path("dense cublas");
      gemm(true, false, in, out, n, x, dy, 0.0f, dw);
      kernels::column_sums(on(s), dy, db, n, out);
    }
    if (dx) gemm(false, true, n, in, out, dy, w, 0.0f, dx);
  });
}

void CudaBackend::relu_forward(const float* x, float* y, std::size_t n) {
  if (n == 0) return;
  compute({x, y}, [&](cudaStream_t s) { kernels::relu_forward(on(s), x, y, n); });
}

void CudaBackend::relu_backward(const float* y, const float* dy, float* dx, std::size_t n) {
  if (n == 0) return;
  compute({y, dy, dx}, [&](cudaStream_t s) { kernels::relu_backward(on(s), y, dy, dx, n); });
}

// Images per im2col chunk: as many as fit the workspace bound.
int CudaBackend::conv_chunk(const ConvShape& s) const {
  const std::size_t per_image =
      std::size_t(s.out_h()) * s.out_w() * (std::size_t(s.c) * s.kernel * s.kernel + s.filters);
  return int(std::clamp<std::size_t>(kConvWorkspaceFloats / per_image, 1, std::size_t(s.n)));
}

// Per chunk: the im2col matrix [c*k*k x chunk*pixels] and the GEMM's
// filter-major output [filters x chunk*pixels]; after them, the bias
// gradient's partial sums.
// With cuDNN, its workspace if larger: callers size the workspace at their
// largest batch and call with smaller ones too, and the im2col size, which
// grows with the batch, bounds cuDNN's needs at the smaller batches as well.
std::size_t CudaBackend::conv2d_workspace(const ConvShape& s) const {
  check_conv(s, "conv2d_workspace");
  const std::size_t im2col =
      conv_chunk_floats(s) +
      std::size_t(kernels::conv_bias_slices(s.n, s.filters, sm_count_)) * s.filters;
  if (!use_cudnn(s)) return im2col;
  return std::max(im2col, (cudnn_->workspace_bytes(s) + sizeof(float) - 1) / sizeof(float));
}

std::size_t CudaBackend::conv_chunk_floats(const ConvShape& s) const {
  return std::size_t(conv_chunk(s)) * s.out_h() * s.out_w() *
         (std::size_t(s.c) * s.kernel * s.kernel + s.filters);
}

// The im2col path's matrix of the whole batch, chunk after chunk; cuDNN
// computes none.
std::size_t CudaBackend::conv2d_columns(const ConvShape& s) const {
  check_conv(s, "conv2d_columns");
  return use_cudnn(s) ? 0 : conv2d_im2col_columns(s);
}

void CudaBackend::conv2d_forward(const float* x, const float* w, const float* b, float* y,
                                 float* workspace, float* columns, const ConvShape& s) {
  conv_forward(x, w, b, y, workspace, columns, s, false);
}

void CudaBackend::conv2d_relu_forward(const float* x, const float* w, const float* b, float* y,
                                      float* workspace, float* columns, const ConvShape& s) {
  conv_forward(x, w, b, y, workspace, columns, s, true);
}

// With `columns`, each chunk's im2col matrix goes to its place in the matrix
// of the whole batch there rather than to the workspace.
void CudaBackend::conv_forward(const float* x, const float* w, const float* b, float* y,
                               float* workspace, float* columns, const ConvShape& s, bool relu) {
  check_conv(s, "conv2d_forward");
  count_conv_path(s);
  if (use_cudnn(s)) {
    const std::size_t bytes = conv2d_workspace(s) * sizeof(float);
    return compute({x, w, b, y, workspace},
                   [&](cudaStream_t) { cudnn_->forward(x, w, b, y, workspace, bytes, s, relu); });
  }
  const int chunk = conv_chunk(s), pixels = s.out_h() * s.out_w();
  const int ckk = s.c * s.kernel * s.kernel;
  compute({x, w, b, y, workspace, columns}, [&](cudaStream_t st) {
    float* const tmp = workspace + std::size_t(chunk) * pixels * ckk;
    for (int first = 0; first < s.n; first += chunk) {
      const int count = std::min(chunk, s.n - first);
      const std::size_t width = std::size_t(count) * pixels;
      float* col = columns ? columns + std::size_t(first) * pixels * ckk : workspace;
      const float* xi = x + std::size_t(first) * s.c * s.h * s.w;
      kernels::im2col(on(st), xi, col, count, s.c, s.h, s.w, s.kernel);
      gemm(false, false, s.filters, int(width), ckk, w, col, 0.0f, tmp);
      kernels::conv_output(on(st), tmp, b, y + std::size_t(first) * s.filters * pixels, count,
                           s.filters, pixels, relu);
    }
  });
}

// With `columns`, the kept matrix feeds the weight gradient and the column
// gradients go to the workspace, leaving the matrix as it was.
void CudaBackend::conv2d_backward(const float* x, const float* w, const float* dy, float* dx,
                                  float* dw, float* db, float* workspace, const float* columns,
                                  const ConvShape& s) {
  check_conv(s, "conv2d_backward");
  count_conv_path(s);
  if (use_cudnn(s)) {
    const std::size_t bytes = conv2d_workspace(s) * sizeof(float);
    return compute({x, w, dy, dx, dw, db, workspace}, [&](cudaStream_t) {
      cudnn_->backward(x, w, dy, dx, dw, db, workspace, bytes, s);
    });
  }
  const int chunk = conv_chunk(s), pixels = s.out_h() * s.out_w();
  const int ckk = s.c * s.kernel * s.kernel;
  compute({x, w, dy, dx, dw, db, workspace, columns}, [&](cudaStream_t st) {
    kernels::conv_bias_grad(on(st), dy, db, workspace + conv_chunk_floats(s), s.n, s.filters,
                            pixels);
    float* const col = workspace;
    float* const tmp = workspace + std::size_t(chunk) * pixels * ckk;
    for (int first = 0; first < s.n; first += chunk) {
      const int count = std::min(chunk, s.n - first);
      const std::size_t width = std::size_t(count) * pixels;
      const std::size_t image = std::size_t(s.c) * s.h * s.w;
      kernels::conv_gather(on(st), dy + std::size_t(first) * s.filters * pixels, tmp, count,
                           s.filters, pixels);
      const float* matrix = col;
      if (columns) {
        matrix = columns + std::size_t(first) * pixels * ckk;
      } else {
        kernels::im2col(on(st), x + first * image, col, count, s.c, s.h, s.w, s.kernel);
      }
      // dw [filters x ckk] += tmp [filters x width] * matrix^T.
      gemm(false, true, s.filters, ckk, int(width), tmp, matrix, first == 0 ? 0.0f : 1.0f, dw);
      if (!dx) continue;
      // The column gradients go to the workspace's im2col matrix, which the
      // GEMM above has consumed if it was used (same stream).
      gemm(true, false, ckk, int(width), s.filters, w, tmp, 0.0f, col);
      kernels::col2im(on(st), col, dx + first * image, count, s.c, s.h, s.w, s.kernel);
    }
  });
}

void CudaBackend::maxpool_forward(const float* x, float* y, std::int32_t* argmax,
                                  const PoolShape& s) {
  check_pool(s, "maxpool_forward");
  check_dims(std::size_t(s.n) * s.c * s.h * s.w <= std::size_t(INT32_MAX), "maxpool_forward",
             "input too large for 32-bit argmax indices");
  compute({x, y, argmax}, [&](cudaStream_t st) {
    kernels::maxpool_forward(on(st), x, y, argmax, s.n, s.c, s.h, s.w, s.k);
  });
}

void CudaBackend::maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx,
                                   const PoolShape& s) {
  check_pool(s, "maxpool_backward");
  compute({dy, argmax, dx}, [&](cudaStream_t st) {
    kernels::maxpool_backward(on(st), dy, argmax, dx, s.n, s.c, s.h, s.w, s.k);
  });
}

void CudaBackend::softmax_xent(const float* logits, const std::int32_t* labels, float* dlogits,
                               float* loss, float* correct, int n, int classes) {
  check_dims(n > 0 && classes > 0, "softmax_xent",
             "n and classes must be positive (got " + std::to_string(n) + ", " +
                 std::to_string(classes) + ")");
  compute({logits, labels, dlogits, loss, correct}, [&](cudaStream_t st) {
    kernels::softmax_xent(on(st), logits, labels, dlogits, loss, correct, n, classes);
  });
}

void CudaBackend::bce_logits(const float* logits, const std::int32_t* labels, float* dlogits,
                             float* loss, float* correct, int n) {
  check_dims(n > 0, "bce_logits", "n must be positive (got " + std::to_string(n) + ")");
  compute({logits, labels, dlogits, loss, correct}, [&](cudaStream_t st) {
    kernels::bce_logits(on(st), logits, labels, dlogits, loss, correct, n);
  });
}

void CudaBackend::dot_interaction_forward(const float* x, float* y, const InteractionShape& s) {
  check_dims(s.n > 0 && s.vectors > 1 && s.dim > 0 && s.keep >= 0 && s.keep <= s.in_width(),
             "dot_interaction_forward",
             "n and dim must be positive, vectors at least 2, keep within the input");
  compute({x, y}, [&](cudaStream_t st) { kernels::dot_interaction_forward(on(st), x, y, s); });
}

void CudaBackend::dot_interaction_backward(const float* x, const float* dy, float* dx,
                                           const InteractionShape& s) {
  check_dims(s.n > 0 && s.vectors > 1 && s.dim > 0 && s.keep >= 0 && s.keep <= s.in_width(),
             "dot_interaction_backward",
             "n and dim must be positive, vectors at least 2, keep within the input");
  compute({x, dy, dx},
          [&](cudaStream_t st) { kernels::dot_interaction_backward(on(st), x, dy, dx, s); });
}

void CudaBackend::embedding_forward(const float* rows, const std::int32_t* inverse, float* out,
                                    const EmbeddingShape& s) {
  check_dims(s.n > 0 && s.k > 0 && s.dim > 0 && s.stride >= s.width(), "embedding_forward",
             "n, k and dim must be positive and stride at least the layer's width");
  compute({rows, inverse, out},
          [&](cudaStream_t st) { kernels::embedding_forward(on(st), rows, inverse, out, s); });
}

void CudaBackend::embedding_backward(const float* dout, const std::int32_t* by_row,
                                     const std::int32_t* offsets, float* drows,
                                     const EmbeddingShape& s) {
  check_dims(s.unique > 0 && s.k > 0 && s.dim > 0 && s.stride >= s.width(), "embedding_backward",
             "unique, k and dim must be positive and stride at least the layer's width");
  compute({dout, by_row, offsets, drows}, [&](cudaStream_t st) {
    kernels::embedding_backward(on(st), dout, by_row, offsets, drows, s);
  });
}

void CudaBackend::copy_columns(const float* src, std::size_t src_stride, float* dst,
                               std::size_t dst_stride, std::size_t rows, std::size_t cols) {
  if (rows == 0 || cols == 0) return;
  compute({src, dst}, [&](cudaStream_t st) {
    kernels::copy_columns(on(st), src, src_stride, dst, dst_stride, rows, cols);
  });
}

void CudaBackend::scale(float* x, float a, std::size_t n) {
  if (n == 0) return;
  compute({x}, [&](cudaStream_t st) { kernels::scale(on(st), x, a, n); });
}

void CudaBackend::apply_optimizer(const OptimizerConfig& c, float* w, const float* g, float* state,
                                  std::size_t n, std::uint64_t step, float lr_scale) {
  if (n == 0) return;
  const auto s = opt::OptimizerStep::make(c, n, step, lr_scale);
  const kernels::LiveStep* live = capturing_ ? capturing_->live_step(c) : nullptr;
  compute({w, g, state},
          [&](cudaStream_t st) { kernels::optimizer(on(st), s, live, w, g, state); });
}

bool CudaBackend::records_steps() const { return precision_ == Precision::fp32; }

// At bf16 and fp16 the GEMMs' operand scratch grows with cudaMalloc as
// shapes need and frees the old buffer once idle: a capture cannot allocate,
// and a replay would use freed memory. Such steps run eagerly.
std::unique_ptr<StepGraph> CudaBackend::make_step_graph(StepWork work) {
  check_dims(precision_ == Precision::fp32, "make_step_graph",
             "step graphs record fp32 steps only, not " + std::string(to_string(precision_)) +
                 " (the half-precision scratch grows as shapes need)");
  return std::make_unique<CudaStepGraph>(*this, std::move(work));
}

void CudaBackend::apply_optimizers(const OptimizerConfig& c,
                                   std::span<const OptimizerTensor> tensors, std::uint64_t step,
                                   float lr_scale) {
  const DeviceScope scope(device_);
  const auto launch = [&](const kernels::LiveStep* live) {
    kernels::optimizers(on(order_.compute_stream()), opt::OptimizerStep::make(c, 0, step, lr_scale),
                        live, tensors.data(), tensors.size());
  };
  // While a step graph captures, launch only, as compute() does: ordering
  // against copies and side work (NCCL's buckets) would make the captured
  // stream wait for events recorded outside the capture, which CUDA refuses;
  // the graph's launch is ordered as a whole instead (CudaStepGraph::run).
  if (capturing_) return launch(capturing_->live_step(c));
  // compute() orders a fixed list of buffers; here every tensor's three are
  // ordered, then recorded as touched by the launches even when one throws
  // (the chunks before it are queued).
  for (const OptimizerTensor& t : tensors) order_.before_compute({t.w, t.g, t.state});
  const auto issued = [&]() noexcept {
    for (const OptimizerTensor& t : tensors) order_.after_compute({t.w, t.g, t.state});
  };
  try {
    launch(nullptr);
  } catch (...) {
    issued();
    throw;
  }
  issued();
}

void CudaBackend::axpby(float a, const float* x, float b, float* y, std::size_t n) {
  if (n == 0) return;
  compute({x, y}, [&](cudaStream_t st) { kernels::axpby(on(st), a, x, b, y, n); });
}

}  // namespace pstrain::cuda
