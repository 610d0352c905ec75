// The CUDA backend: stream ordering, fences, cuBLAS GEMMs and the layer
// kernels. Per-element math comes from client/elementwise.h and
// shared/optimizer_math.h, the definitions the CPU backend uses too.
#include "client/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "client/elementwise.h"
#include "shared/optimizer_math.h"

namespace pstrain::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxMarks = 32;
// The im2col buffers of one convolution chunk; bounds the workspace at large
// batches (the GEMMs are already large enough to fill the GPU well before).
constexpr std::size_t kConvWorkspaceFloats = std::size_t{1} << 24;

// ---- kernels -------------------------------------------------------------

__global__ void fill_kernel(float* x, float value, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

__global__ void scale_kernel(float* x, float a, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] *= a;
  }
}

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    y[i] = ew::relu(x[i]);
  }
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx,
                                     std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    dx[i] = ew::relu_grad(y[i], dy[i]);
  }
}

// y[row, col] = b[col]: the GEMM then accumulates x*w onto it (beta = 1).
__global__ void broadcast_rows_kernel(const float* b, float* y, int rows, int cols) {
  const std::size_t total = std::size_t(rows) * cols;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < total;
       i += std::size_t{gridDim.x} * blockDim.x) {
    y[i] = b[i % cols];
  }
}

// out[col] = sum over rows of x[row, col]. A 32 x 8 block: 32 adjacent columns
// read coalesced, 8 row phases reduced through shared memory.
__global__ void column_sums_kernel(const float* x, float* out, int rows, int cols) {
  __shared__ float partial[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += 8) sum += x[std::size_t(r) * cols + col];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int k = 1; k < 8; ++k) sum += partial[k][threadIdx.x];
    out[col] = sum;
  }
}

__device__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;
}

// db[f] = sum over images and pixels of dy[i, f, p]; one block per filter.
__global__ void conv_bias_grad_kernel(const float* dy, float* db, int n, int filters,
                                      int pixels) {
  const int f = blockIdx.x;
  const std::size_t total = std::size_t(n) * pixels;
  float sum = 0.0f;
  for (std::size_t e = threadIdx.x; e < total; e += kThreads) {
    const std::size_t i = e / pixels, p = e % pixels;
    sum += dy[(i * filters + f) * pixels + p];
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) db[f] = sum;
}

// col[(ch*k + u)*k + v, i*pixels + oy*ow + ox] = x[i, ch, oy+u, ox+v] for the
// `count` images starting at x.
__global__ void im2col_kernel(const float* x, float* col, int count, int c, int h,
                              int w, int k) {
  const int oh = h - k + 1, ow = w - k + 1, pixels = oh * ow;
  const std::size_t columns = std::size_t(count) * pixels;
  const std::size_t total = columns * c * k * k;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t row = e / columns, column = e % columns;
    const int v = int(row % k), u = int(row / k % k), ch = int(row / (k * k));
    const std::size_t i = column / pixels;
    const int p = int(column % pixels), oy = p / ow, ox = p % ow;
    col[e] = x[((i * c + ch) * h + oy + u) * w + ox + v];
  }
}

// The adjoint of im2col: dx[i, ch, y, x] sums the column entries that read it.
// One thread per dx element, so no atomics.
__global__ void col2im_kernel(const float* col, float* dx, int count, int c, int h,
                              int w, int k) {
  const int oh = h - k + 1, ow = w - k + 1, pixels = oh * ow;
  const std::size_t columns = std::size_t(count) * pixels;
  const std::size_t total = std::size_t(count) * c * h * w;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const int xx = int(e % w), yy = int(e / w % h), ch = int(e / (std::size_t(w) * h) % c);
    const std::size_t i = e / (std::size_t(w) * h * c);
    float sum = 0.0f;
    for (int u = 0; u < k; ++u) {
      const int oy = yy - u;
      if (oy < 0 || oy >= oh) continue;
      for (int v = 0; v < k; ++v) {
        const int ox = xx - v;
        if (ox < 0 || ox >= ow) continue;
        sum += col[std::size_t((ch * k + u) * k + v) * columns + i * pixels + oy * ow + ox];
      }
    }
    dx[e] = sum;
  }
}

// y[i, f, p] = tmp[f, i*pixels + p] + b[f]: from the GEMM's filter-major
// layout back to NCHW, adding the bias on the way.
__global__ void conv_output_kernel(const float* tmp, const float* b, float* y, int count,
                                   int filters, int pixels) {
  const std::size_t total = std::size_t(count) * filters * pixels;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t p = e % pixels, f = e / pixels % filters, i = e / (std::size_t(pixels) * filters);
    y[e] = tmp[(f * count + i) * pixels + p] + b[f];
  }
}

// tmp[f, i*pixels + p] = dy[i, f, p]: NCHW gradients to the GEMM's layout.
__global__ void conv_gather_kernel(const float* dy, float* tmp, int count, int filters,
                                   int pixels) {
  const std::size_t total = std::size_t(count) * filters * pixels;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t p = e % pixels, f = e / pixels % filters, i = e / (std::size_t(pixels) * filters);
    tmp[(f * count + i) * pixels + p] = dy[e];
  }
}

__global__ void maxpool_forward_kernel(const float* x, float* y, std::int32_t* argmax,
                                       int n, int c, int h, int w, int k) {
  const int oh = h / k, ow = w / k;
  const std::size_t total = std::size_t(n) * c * oh * ow;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const int ox = int(e % ow), oy = int(e / ow % oh);
    const std::size_t plane = e / (std::size_t(ow) * oh);  // i * c + ch
    const std::size_t corner = plane * h * w + std::size_t(oy * k) * w + ox * k;
    std::size_t best = corner;
    float best_value = x[corner];
    for (int u = 0; u < k; ++u) {
      for (int v = 0; v < k; ++v) {
        const std::size_t xi = corner + std::size_t(u) * w + v;
        const float value = x[xi];
        if (ew::takes_max(value, best_value)) best = xi, best_value = value;
      }
    }
    y[e] = best_value;
    argmax[e] = std::int32_t(best);
  }
}

__global__ void scatter_add_kernel(const float* dy, const std::int32_t* index, float* dx,
                                   std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    atomicAdd(dx + index[i], dy[i]);
  }
}

// One warp per sample. A label outside [0, classes) cannot be reported from
// here; its row's loss and gradients become NaN, which training notices.
__global__ void softmax_xent_kernel(const float* logits, const std::int32_t* labels,
                                    float* dlogits, float* loss, float* correct, int n,
                                    int classes) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n) return;
  const float* x = logits + std::size_t(row) * classes;
  float* dx = dlogits + std::size_t(row) * classes;
  // Each lane scans its classes in increasing order (first maximum wins);
  // the warp then keeps the larger value, ties going to the lower index.
  int best = -1;
  float best_value = 0.0f;
  for (int j = lane; j < classes; j += 32) {
    if (best < 0 || ew::takes_max(x[j], best_value)) best = j, best_value = x[j];
  }
  for (int o = 16; o > 0; o >>= 1) {
    const int other = __shfl_xor_sync(0xffffffffu, best, o);
    const float other_value = __shfl_xor_sync(0xffffffffu, best_value, o);
    if (other >= 0 && (best < 0 || ew::takes_max(other_value, best_value) ||
                       (!ew::takes_max(best_value, other_value) && other < best))) {
      best = other, best_value = other_value;
    }
  }
  float sum = 0.0f;
  for (int j = lane; j < classes; j += 32) sum += ew::softmax_exp_term(x[j], best_value);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float lse = ew::log_sum_exp(best_value, sum);
  const std::int32_t label = labels[row];
  const bool valid = label >= 0 && label < classes;
  const float inv_n = 1.0f / float(n);
  for (int j = lane; j < classes; j += 32) {
    dx[j] = valid ? ew::xent_grad(x[j], lse, j == label, inv_n) : NAN;
  }
  if (lane == 0) {
    loss[row] = valid ? ew::xent_loss(x[label], lse) : NAN;
    correct[row] = ew::correct(best, label);
  }
}

struct OptimizerArgs {
  OptimizerKind kind;
  float lr, momentum, beta1, beta2, eps, weight_decay, bias1, bias2;
  bool nesterov;
};

__global__ void optimizer_kernel(OptimizerArgs a, float* w, const float* g, float* state,
                                 std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    switch (a.kind) {
      case OptimizerKind::sgd:
        opt::sgd_step(w[i], g[i], a.lr, a.weight_decay);
        break;
      case OptimizerKind::momentum:
        opt::momentum_step(w[i], state[i], g[i], a.lr, a.momentum, a.weight_decay,
                           a.nesterov);
        break;
      case OptimizerKind::adam:
        opt::adam_step(w[i], state[i], state[n + i], g[i], a.lr, a.beta1, a.beta2, a.eps,
                       a.bias1, a.bias2, a.weight_decay);
        break;
      case OptimizerKind::adagrad:
        opt::adagrad_step(w[i], state[i], g[i], a.lr, a.eps, a.weight_decay);
        break;
    }
  }
}

void check_dims(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("cuda backend: ") + op + ": " + what);
}

std::string conv_text(const ConvShape& s) {
  return "n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) + " h=" +
         std::to_string(s.h) + " w=" + std::to_string(s.w) + " filters=" +
         std::to_string(s.filters) + " kernel=" + std::to_string(s.kernel);
}

void check_conv(const ConvShape& s, const char* op) {
  check_dims(s.n > 0 && s.c > 0 && s.filters > 0 && s.kernel > 0 && s.out_h() > 0 &&
                 s.out_w() > 0,
             op, "invalid shape " + conv_text(s));
}

void check_pool(const PoolShape& s, const char* op) {
  check_dims(s.n > 0 && s.c > 0 && s.k > 0 && s.out_h() > 0 && s.out_w() > 0, op,
             "invalid shape n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) +
                 " h=" + std::to_string(s.h) + " w=" + std::to_string(s.w) +
                 " k=" + std::to_string(s.k));
}

}  // namespace

// ---- construction --------------------------------------------------------

CudaBackend::CudaBackend(int device) : device_(device) {
  int count = 0;
  PSTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    throw std::invalid_argument("cuda backend: device " + std::to_string(device) +
                                " does not exist (" + std::to_string(count) +
                                " visible device(s))");
  }
  const DeviceScope scope(device_);
  cudaDeviceProp prop{};
  PSTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  sm_count_ = prop.multiProcessorCount;
  name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ", sm_" +
          std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  compute_.stream = make_stream();
  copy_.stream = make_stream();
  cublas_ = make_cublas(compute_.stream.get());
}

CudaBackend::~CudaBackend() {
  // Pinned host buffers and device memory may still be in use by queued
  // copies and kernels; drain both streams before the members free them.
  try {
    const DeviceScope scope(device_);
    report_release_error(cudaStreamSynchronize(copy_.stream.get()), "cudaStreamSynchronize");
    report_release_error(cudaStreamSynchronize(compute_.stream.get()), "cudaStreamSynchronize");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstrain cuda: %s\n", e.what());
  }
}

// ---- memory --------------------------------------------------------------

DeviceMemory CudaBackend::alloc(std::size_t bytes) {
  if (bytes == 0) return {};
  const DeviceScope scope(device_);
  auto memory = device_buffer<std::byte>(bytes);
  void* p = memory.get();
  allocations_.emplace(reinterpret_cast<std::uintptr_t>(p),
                       Allocation{std::move(memory), bytes, 0, 0});
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
  allocations_.erase(reinterpret_cast<std::uintptr_t>(device_ptr));
}

void CudaBackend::release_host(void* host_ptr) noexcept {
  host_allocations_.erase(host_ptr);
}

CudaBackend::Allocation* CudaBackend::find(const void* p) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto it = allocations_.upper_bound(addr);
  if (it == allocations_.begin()) return nullptr;
  --it;
  return addr < it->first + it->second.bytes ? &it->second : nullptr;
}

// ---- ordering ------------------------------------------------------------

std::pair<std::uint64_t, cudaEvent_t> CudaBackend::Timeline::mark_covering(
    std::uint64_t seq) {
  for (auto& [covered, event] : marks) {
    if (covered >= seq) return {covered, event.get()};
  }
  Event event;
  if (marks.size() >= kMaxMarks) {
    // Re-recording is safe: waits already issued on the old record keep it.
    event = std::move(marks.front().second);
    marks.pop_front();
  } else {
    event = make_event();
  }
  PSTRAIN_CUDA_CHECK(cudaEventRecord(event.get(), stream.get()));
  marks.emplace_back(issued, std::move(event));
  return {issued, marks.back().second.get()};
}

void CudaBackend::order_after(Timeline& waiter, Timeline& other, std::uint64_t seq) {
  if (seq <= waiter.waited_on_other) return;
  const auto [covered, event] = other.mark_covering(seq);
  PSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(waiter.stream.get(), event, 0));
  waiter.waited_on_other = covered;
}

void CudaBackend::before_compute(std::initializer_list<const void*> buffers) {
  std::uint64_t needed = 0;
  for (const void* p : buffers) {
    if (!p) continue;
    const Allocation* a = find(p);
    needed = std::max(needed, a ? a->copy_seq : copy_.issued);
  }
  order_after(compute_, copy_, needed);
}

void CudaBackend::after_compute(std::initializer_list<const void*> buffers) {
  const std::uint64_t seq = ++compute_.issued;
  for (const void* p : buffers) {
    if (Allocation* a = p ? find(p) : nullptr) a->compute_seq = seq;
  }
}

void CudaBackend::before_copy(const void* device_ptr) {
  const Allocation* a = find(device_ptr);
  order_after(copy_, compute_, a ? a->compute_seq : compute_.issued);
}

void CudaBackend::after_copy(const void* device_ptr) {
  const std::uint64_t seq = ++copy_.issued;
  if (Allocation* a = find(device_ptr)) a->copy_seq = seq;
}

void CudaBackend::add_watchdog(const void* owner, Watchdog check) {
  watchdogs_.emplace_back(owner, std::move(check));
}

void CudaBackend::remove_watchdog(const void* owner) noexcept {
  std::erase_if(watchdogs_, [owner](const auto& w) { return w.first == owner; });
}

// ---- transfers -----------------------------------------------------------

namespace {
void check_range(const void* base, std::size_t size, const void* p, std::size_t bytes,
                 const char* op) {
  const auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(p) -
                                               static_cast<const std::byte*>(base));
  check_dims(offset + bytes <= size, op,
             std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                 " overrun an allocation of " + std::to_string(size) + " bytes");
}
}  // namespace

void CudaBackend::upload(const void* host, void* device, std::size_t bytes) {
  if (bytes == 0) return;
  const DeviceScope scope(device_);
  if (const auto* a = find(device)) check_range(a->memory.get(), a->bytes, device, bytes, "upload");
  before_copy(device);
  PSTRAIN_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice,
                                     copy_.stream.get()));
  after_copy(device);
}

void CudaBackend::download(const void* device, void* host, std::size_t bytes) {
  if (bytes == 0) return;
  const DeviceScope scope(device_);
  if (const auto* a = find(device)) check_range(a->memory.get(), a->bytes, device, bytes, "download");
  before_copy(device);
  PSTRAIN_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost,
                                     copy_.stream.get()));
  after_copy(device);
}

namespace {
// Grid-stride kernels need no more blocks than keep every SM busy.
unsigned grid_for(std::size_t n, int sm_count) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, std::size_t(sm_count) * 16));
}
}  // namespace

void CudaBackend::fill(float* device, float value, std::size_t n) {
  if (n == 0) return;
  compute({device}, [&](cudaStream_t s) {
    fill_kernel<<<grid_for(n, sm_count_), kThreads, 0, s>>>(device, value, n);
    check_launch("fill_kernel");
  });
}

// ---- fences --------------------------------------------------------------

Event CudaBackend::take_event() {
  if (spare_events_.empty()) return make_event();
  Event e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

bool CudaBackend::fence_complete(const PendingFence& f) const {
  for (cudaEvent_t e : {f.compute.get(), f.copy.get()}) {
    const cudaError_t status = cudaEventQuery(e);
    if (status == cudaErrorNotReady) return false;
    PSTRAIN_CUDA_CHECK(status);
  }
  return true;
}

void CudaBackend::retire_fences_through(Fence id) {
  while (!pending_fences_.empty() && pending_fences_.front().id <= id) {
    spare_events_.push_back(std::move(pending_fences_.front().compute));
    spare_events_.push_back(std::move(pending_fences_.front().copy));
    pending_fences_.pop_front();
  }
  retired_through_ = std::max(retired_through_, id);
}

Backend::Fence CudaBackend::fence() {
  const DeviceScope scope(device_);
  // Completed fences are retired here too, so callers that never wait keep
  // the pending list short.
  while (!pending_fences_.empty() && fence_complete(pending_fences_.front())) {
    retire_fences_through(pending_fences_.front().id);
  }
  PendingFence f{next_fence_, take_event(), take_event()};
  PSTRAIN_CUDA_CHECK(cudaEventRecord(f.compute.get(), compute_.stream.get()));
  PSTRAIN_CUDA_CHECK(cudaEventRecord(f.copy.get(), copy_.stream.get()));
  pending_fences_.push_back(std::move(f));
  return next_fence_++;
}

bool CudaBackend::fence_done(Fence fence) {
  if (fence <= retired_through_) return true;
  check_dims(fence < next_fence_, "fence_done", "fence " + std::to_string(fence) + " was never issued");
  const DeviceScope scope(device_);
  const PendingFence& f = pending_fences_[fence - pending_fences_.front().id];
  if (!fence_complete(f)) return false;
  retire_fences_through(fence);
  return true;
}

void CudaBackend::wait(Fence fence) {
  if (fence <= retired_through_) return;
  check_dims(fence < next_fence_, "wait", "fence " + std::to_string(fence) + " was never issued");
  const DeviceScope scope(device_);
  const PendingFence& f = pending_fences_[fence - pending_fences_.front().id];
  if (watchdogs_.empty()) {
    PSTRAIN_CUDA_CHECK(cudaEventSynchronize(f.compute.get()));
    PSTRAIN_CUDA_CHECK(cudaEventSynchronize(f.copy.get()));
  } else {
    // A collective whose peer died never completes; polling lets the
    // communicator's watchdog abort it and throw instead.
    const auto start = std::chrono::steady_clock::now();
    while (!fence_complete(f)) {
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
      for (const auto& [owner, check] : watchdogs_) check(waited.count());
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  retire_fences_through(fence);
}

// ---- math ----------------------------------------------------------------

// Row-major C[m x n] = op(A) op(B) (+ beta C) through column-major cuBLAS:
// a row-major matrix is its transpose in column-major, so compute
// C^T = op(B)^T op(A)^T with the operands swapped.
void CudaBackend::gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                       const float* b, float beta, float* c) {
  const float alpha = 1.0f;
  PSTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                                 trans_b ? k : n, a, trans_a ? m : k, &beta, c, n));
}

void CudaBackend::dense_forward(const float* x, const float* w, const float* b, float* y,
                                int n, int in, int out) {
  check_dims(n > 0 && in > 0 && out > 0, "dense_forward",
             "n, in and out must be positive (got " + std::to_string(n) + ", " +
                 std::to_string(in) + ", " + std::to_string(out) + ")");
  compute({x, w, b, y}, [&](cudaStream_t s) {
    const std::size_t total = std::size_t(n) * out;
    broadcast_rows_kernel<<<grid_for(total, sm_count_), kThreads, 0, s>>>(b, y, n, out);
    check_launch("broadcast_rows_kernel");
    gemm(false, false, n, out, in, x, w, 1.0f, y);
  });
}

void CudaBackend::dense_backward(const float* x, const float* w, const float* dy, float* dx,
                                 float* dw, float* db, int n, int in, int out) {
  check_dims(n > 0 && in > 0 && out > 0, "dense_backward",
             "n, in and out must be positive (got " + std::to_string(n) + ", " +
                 std::to_string(in) + ", " + std::to_string(out) + ")");
  compute({x, w, dy, dx, dw, db}, [&](cudaStream_t s) {
    gemm(true, false, in, out, n, x, dy, 0.0f, dw);
    column_sums_kernel<<<(out + 31) / 32, dim3(32, 8), 0, s>>>(dy, db, n, out);
    check_launch("column_sums_kernel");
    if (dx) gemm(false, true, n, in, out, dy, w, 0.0f, dx);
  });
}

void CudaBackend::relu_forward(const float* x, float* y, std::size_t n) {
  if (n == 0) return;
  compute({x, y}, [&](cudaStream_t s) {
    relu_forward_kernel<<<grid_for(n, sm_count_), kThreads, 0, s>>>(x, y, n);
    check_launch("relu_forward_kernel");
  });
}

void CudaBackend::relu_backward(const float* y, const float* dy, float* dx, std::size_t n) {
  if (n == 0) return;
  compute({y, dy, dx}, [&](cudaStream_t s) {
    relu_backward_kernel<<<grid_for(n, sm_count_), kThreads, 0, s>>>(y, dy, dx, n);
    check_launch("relu_backward_kernel");
  });
}

// Images per im2col chunk: as many as fit the workspace bound.
int CudaBackend::conv_chunk(const ConvShape& s) const {
  const std::size_t per_image = std::size_t(s.out_h()) * s.out_w() *
                                (std::size_t(s.c) * s.kernel * s.kernel + s.filters);
  return int(std::clamp<std::size_t>(kConvWorkspaceFloats / per_image, 1, std::size_t(s.n)));
}

// Per chunk: the im2col matrix [c*k*k x chunk*pixels] and the GEMM's
// filter-major output [filters x chunk*pixels].
std::size_t CudaBackend::conv2d_workspace(const ConvShape& s) const {
  check_conv(s, "conv2d_workspace");
  return std::size_t(conv_chunk(s)) * s.out_h() * s.out_w() *
         (std::size_t(s.c) * s.kernel * s.kernel + s.filters);
}

void CudaBackend::conv2d_forward(const float* x, const float* w, const float* b, float* y,
                                 float* workspace, const ConvShape& s) {
  check_conv(s, "conv2d_forward");
  const int chunk = conv_chunk(s), pixels = s.out_h() * s.out_w();
  const int ckk = s.c * s.kernel * s.kernel;
  compute({x, w, b, y, workspace}, [&](cudaStream_t st) {
    for (int first = 0; first < s.n; first += chunk) {
      const int count = std::min(chunk, s.n - first);
      const std::size_t columns = std::size_t(count) * pixels;
      float* col = workspace;
      float* tmp = workspace + columns * ckk;
      const float* xi = x + std::size_t(first) * s.c * s.h * s.w;
      im2col_kernel<<<grid_for(columns * ckk, sm_count_), kThreads, 0, st>>>(
          xi, col, count, s.c, s.h, s.w, s.kernel);
      check_launch("im2col_kernel");
      gemm(false, false, s.filters, int(columns), ckk, w, col, 0.0f, tmp);
      conv_output_kernel<<<grid_for(columns * s.filters, sm_count_), kThreads, 0, st>>>(
          tmp, b, y + std::size_t(first) * s.filters * pixels, count, s.filters, pixels);
      check_launch("conv_output_kernel");
    }
  });
}

void CudaBackend::conv2d_backward(const float* x, const float* w, const float* dy, float* dx,
                                  float* dw, float* db, float* workspace, const ConvShape& s) {
  check_conv(s, "conv2d_backward");
  const int chunk = conv_chunk(s), pixels = s.out_h() * s.out_w();
  const int ckk = s.c * s.kernel * s.kernel;
  compute({x, w, dy, dx, dw, db, workspace}, [&](cudaStream_t st) {
    conv_bias_grad_kernel<<<s.filters, kThreads, 0, st>>>(dy, db, s.n, s.filters, pixels);
    check_launch("conv_bias_grad_kernel");
    for (int first = 0; first < s.n; first += chunk) {
      const int count = std::min(chunk, s.n - first);
      const std::size_t columns = std::size_t(count) * pixels;
      float* col = workspace;
      float* tmp = workspace + columns * ckk;
      const std::size_t image = std::size_t(s.c) * s.h * s.w;
      conv_gather_kernel<<<grid_for(columns * s.filters, sm_count_), kThreads, 0, st>>>(
          dy + std::size_t(first) * s.filters * pixels, tmp, count, s.filters, pixels);
      check_launch("conv_gather_kernel");
      im2col_kernel<<<grid_for(columns * ckk, sm_count_), kThreads, 0, st>>>(
          x + first * image, col, count, s.c, s.h, s.w, s.kernel);
      check_launch("im2col_kernel");
      // dw [filters x ckk] += tmp [filters x columns] * col^T.
      gemm(false, true, s.filters, ckk, int(columns), tmp, col, first == 0 ? 0.0f : 1.0f, dw);
      if (!dx) continue;
      // The column gradients reuse col, which the GEMM above has consumed
      // (same stream).
      gemm(true, false, ckk, int(columns), s.filters, w, tmp, 0.0f, col);
      col2im_kernel<<<grid_for(count * image, sm_count_), kThreads, 0, st>>>(
          col, dx + first * image, count, s.c, s.h, s.w, s.kernel);
      check_launch("col2im_kernel");
    }
  });
}

void CudaBackend::maxpool_forward(const float* x, float* y, std::int32_t* argmax,
                                  const PoolShape& s) {
  check_pool(s, "maxpool_forward");
  const std::size_t total = std::size_t(s.n) * s.c * s.out_h() * s.out_w();
  check_dims(std::size_t(s.n) * s.c * s.h * s.w <= std::size_t(INT32_MAX), "maxpool_forward",
             "input too large for 32-bit argmax indices");
  compute({x, y, argmax}, [&](cudaStream_t st) {
    maxpool_forward_kernel<<<grid_for(total, sm_count_), kThreads, 0, st>>>(
        x, y, argmax, s.n, s.c, s.h, s.w, s.k);
    check_launch("maxpool_forward_kernel");
  });
}

void CudaBackend::maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx,
                                   const PoolShape& s) {
  check_pool(s, "maxpool_backward");
  const std::size_t total = std::size_t(s.n) * s.c * s.out_h() * s.out_w();
  compute({dy, argmax, dx}, [&](cudaStream_t st) {
    PSTRAIN_CUDA_CHECK(cudaMemsetAsync(dx, 0, std::size_t(s.n) * s.c * s.h * s.w * sizeof(float), st));
    scatter_add_kernel<<<grid_for(total, sm_count_), kThreads, 0, st>>>(dy, argmax, dx, total);
    check_launch("scatter_add_kernel");
  });
}

void CudaBackend::softmax_xent(const float* logits, const std::int32_t* labels, float* dlogits,
                               float* loss, float* correct, int n, int classes) {
  check_dims(n > 0 && classes > 0, "softmax_xent",
             "n and classes must be positive (got " + std::to_string(n) + ", " +
                 std::to_string(classes) + ")");
  compute({logits, labels, dlogits, loss, correct}, [&](cudaStream_t st) {
    constexpr int rows_per_block = kThreads / 32;
    softmax_xent_kernel<<<(n + rows_per_block - 1) / rows_per_block, kThreads, 0, st>>>(
        logits, labels, dlogits, loss, correct, n, classes);
    check_launch("softmax_xent_kernel");
  });
}

void CudaBackend::scale(float* x, float a, std::size_t n) {
  if (n == 0) return;
  compute({x}, [&](cudaStream_t st) {
    scale_kernel<<<grid_for(n, sm_count_), kThreads, 0, st>>>(x, a, n);
    check_launch("scale_kernel");
  });
}

void CudaBackend::apply_optimizer(const OptimizerConfig& c, float* w, const float* g,
                                  float* state, std::size_t n, std::uint64_t step,
                                  float lr_scale) {
  if (n == 0) return;
  // Adam's bias corrections once per call, in double, exactly as Optimizer.
  const auto t = static_cast<double>(step == 0 ? 1 : step);
  const OptimizerArgs args{c.kind,
                           c.lr * lr_scale,
                           c.momentum,
                           c.beta1,
                           c.beta2,
                           c.eps,
                           c.weight_decay,
                           static_cast<float>(1.0 - std::pow(double(c.beta1), t)),
                           static_cast<float>(1.0 - std::pow(double(c.beta2), t)),
                           c.nesterov};
  compute({w, g, state}, [&](cudaStream_t st) {
    optimizer_kernel<<<grid_for(n, sm_count_), kThreads, 0, st>>>(args, w, g, state, n);
    check_launch("optimizer_kernel");
  });
}

}  // namespace pstrain::cuda
