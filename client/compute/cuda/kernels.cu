// The kernels of the CUDA backend and the functions that launch them.
// Per-element math comes from client/compute/elementwise.h and
// shared/optimizer_math.h, the definitions the CPU backend uses too.
#include "client/compute/cuda/kernels.h"

#include <algorithm>
#include <cmath>

#include "client/compute/cuda/cuda_check.h"
#include "client/compute/elementwise.h"
#include "shared/optimizer_math.h"

namespace pstrain::cuda::kernels {
namespace {

constexpr int kThreads = 256;

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

__global__ void axpby_kernel(float a, const float* x, float b, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    y[i] = ew::axpby(a, x[i], b, y[i]);
  }
}

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    y[i] = ew::relu(x[i]);
  }
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
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

// partial[s, f] = sum over the images i = s, s + slices, ... and their pixels
// of dy[i, f, p]: block (f, s), so filters x slices blocks share the work
// (one block per filter left most SMs idle). Each image's filter plane is
// contiguous, so a block reads it coalesced with 32-bit offsets and no
// division.
__global__ void conv_bias_partials_kernel(const float* dy, float* partial, int n, int filters,
                                          int pixels) {
  const int f = blockIdx.x, slice = blockIdx.y, slices = gridDim.y;
  float sum = 0.0f;
  for (int i = slice; i < n; i += slices) {
    const float* plane = dy + (std::size_t(i) * filters + f) * pixels;
    for (int p = threadIdx.x; p < pixels; p += kThreads) sum += plane[p];
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[std::size_t(slice) * filters + f] = sum;
}

// col[(ch*k + u)*k + v, i*pixels + oy*ow + ox] = x[i, ch, oy+u, ox+v] for the
// `count` images starting at x.
__global__ void im2col_kernel(const float* x, float* col, int count, int c, int h, int w, int k) {
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
__global__ void col2im_kernel(const float* col, float* dx, int count, int c, int h, int w, int k) {
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
// layout back to NCHW, adding the bias and applying a following relu on the
// way (one branch for the whole grid).
__global__ void conv_output_kernel(const float* tmp, const float* b, float* y, int count,
                                   int filters, int pixels, bool relu) {
  const std::size_t total = std::size_t(count) * filters * pixels;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t p = e % pixels, f = e / pixels % filters,
                      i = e / (std::size_t(pixels) * filters);
    const float v = tmp[(f * count + i) * pixels + p] + b[f];
    y[e] = relu ? ew::relu(v) : v;
  }
}

// tmp[f, i*pixels + p] = dy[i, f, p]: NCHW gradients to the GEMM's layout.
__global__ void conv_gather_kernel(const float* dy, float* tmp, int count, int filters,
                                   int pixels) {
  const std::size_t total = std::size_t(count) * filters * pixels;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t p = e % pixels, f = e / pixels % filters,
                      i = e / (std::size_t(pixels) * filters);
    tmp[(f * count + i) * pixels + p] = dy[e];
  }
}

__global__ void maxpool_forward_kernel(const float* x, float* y, std::int32_t* argmax, int n, int c,
                                       int h, int w, int k) {
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

// dx[e] = dy[o] where e is the maximum argmax[o] of its window o, else 0
// (the window's other elements, and the remainder rows and columns no window
// covers). Windows do not overlap, so each dx element has one candidate: a
// gather with no zeroing pass and no atomics. Block b handles input plane b
// (image and channel), its threads the plane's pixels.
__global__ void maxpool_backward_kernel(const float* dy, const std::int32_t* argmax, float* dx,
                                        int h, int w, int k) {
  const int oh = h / k, ow = w / k;
  const std::size_t plane = blockIdx.x;
  const std::size_t first_in = plane * h * w, first_out = plane * oh * ow;
  for (int p = threadIdx.x; p < h * w; p += blockDim.x) {
    const int y = p / w, x = p - y * w, oy = y / k, ox = x / k;
    float value = 0.0f;
    if (oy < oh && ox < ow) {
      const std::size_t o = first_out + oy * ow + ox;
      if (std::size_t(argmax[o]) == first_in + p) value = dy[o];
    }
    dx[first_in + p] = value;
  }
}

// One thread per output element: a bag's (sample, column) sums in t order,
// then scales, as the CPU does; an id's block is a copy.
__global__ void embedding_forward_kernel(const float* rows, const std::int32_t* inverse, float* out,
                                         int n, int k, int dim, int stride, bool bag, float scale) {
  const int width = bag ? dim : k * dim;
  const std::size_t total = std::size_t(n) * width;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i = e / width;
    const int c = static_cast<int>(e - i * width);
    if (bag) {
      float acc = 0.0f;
      for (int t = 0; t < k; ++t) acc += rows[std::size_t(inverse[i * k + t]) * dim + c];
      out[i * stride + c] = acc * scale;
    } else {
      const int t = c / dim, j = c - t * dim;
      out[i * stride + c] = rows[std::size_t(inverse[i * k + t]) * dim + j];
    }
  }
}

// One thread per (row, column), over the row's occurrences in by_row's
// order: a segment sum with no atomics, the same bits as the CPU.
__global__ void embedding_backward_kernel(const float* dout, const std::int32_t* by_row,
                                          const std::int32_t* offsets, float* drows, int unique,
                                          int k, int dim, int stride, bool bag, float scale) {
  const std::size_t total = std::size_t(unique) * dim;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t u = e / dim;
    const int j = static_cast<int>(e - u * dim);
    float acc = 0.0f;
    for (std::int32_t o = offsets[u]; o < offsets[u + 1]; ++o)
      acc += dout[ew::embedding_column(by_row[o], j, k, dim, stride, bag)];
    drows[e] = acc * scale;
  }
}

__global__ void copy_columns_kernel(const float* src, std::size_t src_stride, float* dst,
                                    std::size_t dst_stride, std::size_t rows, std::size_t cols) {
  const std::size_t total = rows * cols;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = e / cols, c = e - r * cols;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

// One thread per sample.
__global__ void bce_logits_kernel(const float* logits, const std::int32_t* labels, float* dlogits,
                                  float* loss, float* correct, int n) {
  const float inv_n = 1.0f / float(n);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const std::int32_t y = labels[i];
    const bool valid = y == 0 || y == 1;
    dlogits[i] = valid ? ew::bce_grad(logits[i], y, inv_n) : NAN;
    loss[i] = valid ? ew::bce_loss(logits[i], y) : NAN;
    correct[i] = ew::bce_correct(logits[i], y);
  }
}

// One thread per output element: a passed-through float or one pair's dot.
__global__ void dot_interaction_forward_kernel(const float* x, float* y, InteractionShape s) {
  const int width = s.out_width();
  const std::size_t total = std::size_t(s.n) * width;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i = e / width;
    const int c = static_cast<int>(e - i * width);
    const float* row = x + i * s.in_width();
    if (c < s.keep) {
      y[e] = row[c];
      continue;
    }
    // The pair (a, b) of place p: a's pairs come before (a+1)'s.
    int p = c - s.keep, a = 0;
    while (p >= s.vectors - 1 - a) p -= s.vectors - 1 - a++;
    y[e] = ew::interaction_dot(row, s.dim, a, a + 1 + p);
  }
}

__global__ void dot_interaction_backward_kernel(const float* x, const float* dy, float* dx,
                                                InteractionShape s) {
  const int width = s.in_width();
  const std::size_t total = std::size_t(s.n) * width;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i = e / width;
    const int c = static_cast<int>(e - i * width);
    dx[e] = ew::interaction_grad(x + i * width, dy + i * s.out_width(), s.vectors, s.dim, s.keep,
                                 c / s.dim, c % s.dim);
  }
}

// One warp per sample. A label outside [0, classes) cannot be reported from
// here; its row's loss and gradients become NaN, which training notices.
__global__ void softmax_xent_kernel(const float* logits, const std::int32_t* labels, float* dlogits,
                                    float* loss, float* correct, int n, int classes) {
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

// The same per-element dispatch as the CPU's Optimizer (shared/optimizer_math.h).
// In a CUDA graph the step's own fields come from `live`, which the graph
// refreshes before each replay; the launch's copy of them is the recording's.
__global__ void optimizer_kernel(opt::OptimizerStep s, const LiveStep* live, float* w,
                                 const float* g, float* state) {
  if (live) {
    s.lr = live->lr;
    s.bias1 = live->bias1;
    s.bias2 = live->bias2;
  }
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < s.n;
       i += std::size_t{gridDim.x} * blockDim.x)
    s.apply(i, w[i], g[i], state);
}

// Up to kMultiTensor tensors of one optimizer step, by value (about 1.2 KB
// of the 4 KB of kernel arguments). Tensor t owns the blocks
// [first_block[t], first_block[t + 1]).
struct TensorTable {
  int count;
  unsigned first_block[kMultiTensor + 1];
  OptimizerTensor tensors[kMultiTensor];
};

// Each block finds its tensor (a scan of at most kMultiTensor entries, the
// same for all its threads) and strides over it with that tensor's blocks,
// applying the per-element dispatch optimizer_kernel applies.
// __grid_constant__: the table is read where the arguments lie, not copied
// to local memory for the dynamic index.
__global__ void optimizers_kernel(opt::OptimizerStep s, const LiveStep* live,
                                  const __grid_constant__ TensorTable table) {
  if (live) {  // as in optimizer_kernel
    s.lr = live->lr;
    s.bias1 = live->bias1;
    s.bias2 = live->bias2;
  }
  int t = 0;
  while (t + 1 < table.count && blockIdx.x >= table.first_block[t + 1]) ++t;
  const OptimizerTensor& tensor = table.tensors[t];
  s.n = tensor.n;
  const unsigned blocks = table.first_block[t + 1] - table.first_block[t];
  for (std::size_t i = (blockIdx.x - table.first_block[t]) * std::size_t{blockDim.x} + threadIdx.x;
       i < s.n; i += std::size_t{blocks} * blockDim.x)
    s.apply(i, tensor.w[i], tensor.g[i], tensor.state);
}

__global__ void encode_halves_kernel(HalfFormat format, const float* x, std::uint16_t* out,
                                     std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = encode_half(format, x[i]);
  }
}

__global__ void flag_nonfinite_kernel(const float* x, std::size_t n, int* flag) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    if (!isfinite(x[i])) *flag = 1;  // any writer's 1 will do: no atomics needed
  }
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The flag is read through volatile: the host writes it while the kernel runs.
__global__ void hold_kernel(const volatile std::int32_t* flag, unsigned long long limit_ns) {
  const unsigned long long start = global_ns();
  while (*flag == 0 && global_ns() - start < limit_ns) __nanosleep(1000);
}

// Grid-stride kernels need no more blocks than keep every SM busy.
unsigned grid_for(std::size_t n, int sm_count) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, std::size_t(sm_count) * 16));
}

}  // namespace

void fill(const Launch& l, float* x, float value, std::size_t n) {
  fill_kernel<<<grid_for(n, l.sm_count), kThreads, 0, l.stream>>>(x, value, n);
  check_launch("fill_kernel");
}

void scale(const Launch& l, float* x, float a, std::size_t n) {
  scale_kernel<<<grid_for(n, l.sm_count), kThreads, 0, l.stream>>>(x, a, n);
  check_launch("scale_kernel");
}

void axpby(const Launch& l, float a, const float* x, float b, float* y, std::size_t n) {
  axpby_kernel<<<grid_for(n, l.sm_count), kThreads, 0, l.stream>>>(a, x, b, y, n);
  check_launch("axpby_kernel");
}

void relu_forward(const Launch& l, const float* x, float* y, std::size_t n) {
  relu_forward_kernel<<<grid_for(n, l.sm_count), kThreads, 0, l.stream>>>(x, y, n);
  check_launch("relu_forward_kernel");
}

void relu_backward(const Launch& l, const float* y, const float* dy, float* dx, std::size_t n) {
  relu_backward_kernel<<<grid_for(n, l.sm_count), kThreads, 0, l.stream>>>(y, dy, dx, n);
  check_launch("relu_backward_kernel");
}

void broadcast_rows(const Launch& l, const float* b, float* y, int rows, int cols) {
  const std::size_t total = std::size_t(rows) * cols;
  broadcast_rows_kernel<<<grid_for(total, l.sm_count), kThreads, 0, l.stream>>>(b, y, rows, cols);
  check_launch("broadcast_rows_kernel");
}

void column_sums(const Launch& l, const float* x, float* out, int rows, int cols) {
  column_sums_kernel<<<(cols + 31) / 32, dim3(32, 8), 0, l.stream>>>(x, out, rows, cols);
  check_launch("column_sums_kernel");
}

void conv_bias_grad(const Launch& l, const float* dy, float* db, float* partial, int n, int filters,
                    int pixels) {
  const int slices = conv_bias_slices(n, filters, l.sm_count);
  conv_bias_partials_kernel<<<dim3(filters, slices), kThreads, 0, l.stream>>>(dy, partial, n,
                                                                              filters, pixels);
  check_launch("conv_bias_partials_kernel");
  column_sums(l, partial, db, slices, filters);
}

int conv_bias_slices(int n, int filters, int sm_count) {
  // About four blocks per SM, and never more slices than images.
  return std::clamp((4 * sm_count + filters - 1) / filters, 1, n);
}

void im2col(const Launch& l, const float* x, float* col, int count, int c, int h, int w, int k) {
  const std::size_t total = std::size_t(count) * (h - k + 1) * (w - k + 1) * c * k * k;
  im2col_kernel<<<grid_for(total, l.sm_count), kThreads, 0, l.stream>>>(x, col, count, c, h, w, k);
  check_launch("im2col_kernel");
}

void col2im(const Launch& l, const float* col, float* dx, int count, int c, int h, int w, int k) {
  const std::size_t total = std::size_t(count) * c * h * w;
  col2im_kernel<<<grid_for(total, l.sm_count), kThreads, 0, l.stream>>>(col, dx, count, c, h, w, k);
  check_launch("col2im_kernel");
}

void conv_output(const Launch& l, const float* tmp, const float* b, float* y, int count,
                 int filters, int pixels, bool relu) {
  const std::size_t total = std::size_t(count) * pixels * filters;
  conv_output_kernel<<<grid_for(total, l.sm_count), kThreads, 0, l.stream>>>(tmp, b, y, count,
                                                                             filters, pixels, relu);
  check_launch("conv_output_kernel");
}

void conv_gather(const Launch& l, const float* dy, float* tmp, int count, int filters, int pixels) {
  const std::size_t total = std::size_t(count) * pixels * filters;
  conv_gather_kernel<<<grid_for(total, l.sm_count), kThreads, 0, l.stream>>>(dy, tmp, count,
                                                                             filters, pixels);
  check_launch("conv_gather_kernel");
}

void maxpool_forward(const Launch& l, const float* x, float* y, std::int32_t* argmax, int n, int c,
                     int h, int w, int k) {
  const std::size_t total = std::size_t(n) * c * (h / k) * (w / k);
  maxpool_forward_kernel<<<grid_for(total, l.sm_count), kThreads, 0, l.stream>>>(x, y, argmax, n, c,
                                                                                 h, w, k);
  check_launch("maxpool_forward_kernel");
}

void maxpool_backward(const Launch& l, const float* dy, const std::int32_t* argmax, float* dx,
                      int n, int c, int h, int w, int k) {
  maxpool_backward_kernel<<<unsigned(n) * unsigned(c), kThreads, 0, l.stream>>>(dy, argmax, dx, h,
                                                                                w, k);
  check_launch("maxpool_backward_kernel");
}

void softmax_xent(const Launch& l, const float* logits, const std::int32_t* labels, float* dlogits,
                  float* loss, float* correct, int n, int classes) {
  constexpr int rows_per_block = kThreads / 32;
  softmax_xent_kernel<<<(n + rows_per_block - 1) / rows_per_block, kThreads, 0, l.stream>>>(
      logits, labels, dlogits, loss, correct, n, classes);
  check_launch("softmax_xent_kernel");
}

void bce_logits(const Launch& l, const float* logits, const std::int32_t* labels, float* dlogits,
                float* loss, float* correct, int n) {
  bce_logits_kernel<<<grid_for(std::size_t(n), l.sm_count), kThreads, 0, l.stream>>>(
      logits, labels, dlogits, loss, correct, n);
  check_launch("bce_logits_kernel");
}

void dot_interaction_forward(const Launch& l, const float* x, float* y, const InteractionShape& s) {
  dot_interaction_forward_kernel<<<grid_for(std::size_t(s.n) * s.out_width(), l.sm_count), kThreads,
                                   0, l.stream>>>(x, y, s);
  check_launch("dot_interaction_forward_kernel");
}

void dot_interaction_backward(const Launch& l, const float* x, const float* dy, float* dx,
                              const InteractionShape& s) {
  dot_interaction_backward_kernel<<<grid_for(std::size_t(s.n) * s.in_width(), l.sm_count), kThreads,
                                    0, l.stream>>>(x, dy, dx, s);
  check_launch("dot_interaction_backward_kernel");
}

void embedding_forward(const Launch& l, const float* rows, const std::int32_t* inverse, float* out,
                       const EmbeddingShape& s) {
  embedding_forward_kernel<<<grid_for(std::size_t(s.n) * s.width(), l.sm_count), kThreads, 0,
                             l.stream>>>(rows, inverse, out, s.n, s.k, s.dim, s.stride, s.bag,
                                         ew::pool_scale(s.k, s.mean));
  check_launch("embedding_forward_kernel");
}

void embedding_backward(const Launch& l, const float* dout, const std::int32_t* by_row,
                        const std::int32_t* offsets, float* drows, const EmbeddingShape& s) {
  embedding_backward_kernel<<<grid_for(std::size_t(s.unique) * s.dim, l.sm_count), kThreads, 0,
                              l.stream>>>(dout, by_row, offsets, drows, s.unique, s.k, s.dim,
                                          s.stride, s.bag,
                                          s.bag ? ew::pool_scale(s.k, s.mean) : 1.0f);
  check_launch("embedding_backward_kernel");
}

void copy_columns(const Launch& l, const float* src, std::size_t src_stride, float* dst,
                  std::size_t dst_stride, std::size_t rows, std::size_t cols) {
  copy_columns_kernel<<<grid_for(rows * cols, l.sm_count), kThreads, 0, l.stream>>>(
      src, src_stride, dst, dst_stride, rows, cols);
  check_launch("copy_columns_kernel");
}

void encode_halves(const Launch& l, HalfFormat format, const float* x, std::uint16_t* out,
                   std::size_t n) {
  encode_halves_kernel<<<grid_for(n, l.sm_count), kThreads, 0, l.stream>>>(format, x, out, n);
  check_launch("encode_halves_kernel");
}

void flag_nonfinite(const Launch& l, const float* x, std::size_t n, int* flag) {
  flag_nonfinite_kernel<<<grid_for(n, l.sm_count), kThreads, 0, l.stream>>>(x, n, flag);
  check_launch("flag_nonfinite_kernel");
}

void hold(const Launch& l, const std::int32_t* flag, unsigned long long limit_ns) {
  hold_kernel<<<1, 1, 0, l.stream>>>(flag, limit_ns);
  check_launch("hold_kernel");
}

void optimizer(const Launch& l, const opt::OptimizerStep& step, const LiveStep* live, float* w,
               const float* g, float* state) {
  optimizer_kernel<<<grid_for(step.n, l.sm_count), kThreads, 0, l.stream>>>(step, live, w, g,
                                                                            state);
  check_launch("optimizer_kernel");
}

void optimizers(const Launch& l, const opt::OptimizerStep& step, const LiveStep* live,
                const OptimizerTensor* tensors, std::size_t count) {
  for (std::size_t first = 0; first < count; first += kMultiTensor) {
    TensorTable table{};
    unsigned blocks = 0;
    for (std::size_t t = first; t < std::min(count, first + kMultiTensor); ++t) {
      if (tensors[t].n == 0) continue;
      table.first_block[table.count] = blocks;
      table.tensors[table.count++] = tensors[t];
      blocks += grid_for(tensors[t].n, l.sm_count);
    }
    if (table.count == 0) continue;
    table.first_block[table.count] = blocks;
    optimizers_kernel<<<blocks, kThreads, 0, l.stream>>>(step, live, table);
    check_launch("optimizers_kernel");
  }
}

}  // namespace pstrain::cuda::kernels
