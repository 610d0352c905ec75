#pragma once
// The CUDA backend's kernels, one launch function each: the function picks
// the grid, enqueues the kernel on the given stream and throws CudaError for
// a bad launch. Nothing here orders streams or checks shapes; CudaBackend
// does both before it calls in. Kept apart from the backend so that only
// kernels.cu needs nvcc's device compilation.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "client/compute/embedding_shape.h"
#include "client/compute/interaction_shape.h"
#include "shared/low_precision.h"
#include "shared/optimizer_math.h"

namespace pstrain::cuda::kernels {

// Where a kernel runs, and the device's SM count, which bounds the grids of
// grid-stride kernels.
struct Launch {
  cudaStream_t stream;
  int sm_count;
};

void fill(const Launch& l, float* x, float value, std::size_t n);
void scale(const Launch& l, float* x, float a, std::size_t n);
// y = a x + b y (ew::axpby: b == 0 ignores y's old contents).
void axpby(const Launch& l, float a, const float* x, float b, float* y, std::size_t n);
void relu_forward(const Launch& l, const float* x, float* y, std::size_t n);
void relu_backward(const Launch& l, const float* y, const float* dy, float* dx, std::size_t n);

// y[row, col] = b[col]: a dense layer's GEMM then accumulates x*w onto it.
void broadcast_rows(const Launch& l, const float* b, float* y, int rows, int cols);
// out[col] = sum over rows of x[row, col].
void column_sums(const Launch& l, const float* x, float* out, int rows, int cols);

// Convolution as im2col + GEMM, in chunks of `count` images (cuda_backend.cc).
// db[f] = sum over images and pixels of dy[i, f, p], through partial sums
// over slices of the images in `partial` (conv_bias_slices(...) x filters
// floats), reduced in a fixed order: deterministic, no atomics.
void conv_bias_grad(const Launch& l, const float* dy, float* db, float* partial, int n, int filters,
                    int pixels);
int conv_bias_slices(int n, int filters, int sm_count);
// col[(ch*k + u)*k + v, i*pixels + oy*ow + ox] = x[i, ch, oy+u, ox+v].
void im2col(const Launch& l, const float* x, float* col, int count, int c, int h, int w, int k);
// The adjoint of im2col: dx[i, ch, y, x] sums the column entries that read it.
void col2im(const Launch& l, const float* col, float* dx, int count, int c, int h, int w, int k);
// y[i, f, p] = tmp[f, i*pixels + p] + b[f]: the GEMM's filter-major output
// back to NCHW, plus the bias, through ew::relu when `relu`.
void conv_output(const Launch& l, const float* tmp, const float* b, float* y, int count,
                 int filters, int pixels, bool relu);
// tmp[f, i*pixels + p] = dy[i, f, p]: NCHW gradients to the GEMM's layout.
void conv_gather(const Launch& l, const float* dy, float* tmp, int count, int filters, int pixels);

// k x k max pooling; argmax holds the flat input index of each maximum.
void maxpool_forward(const Launch& l, const float* x, float* y, std::int32_t* argmax, int n, int c,
                     int h, int w, int k);
// dx[e] = dy[o] where argmax[o] == e for the window o holding e, else 0:
// every element of dx is written, no zeroing needed.
void maxpool_backward(const Launch& l, const float* dy, const std::int32_t* argmax, float* dx,
                      int n, int c, int h, int w, int k);

// Per row: loss, 1/n-scaled gradient, and whether the first maximum is the
// label. A label outside [0, classes) makes its row NaN.
void softmax_xent(const Launch& l, const float* logits, const std::int32_t* labels, float* dlogits,
                  float* loss, float* correct, int n, int classes);

// Binary cross-entropy per sample, as Backend::bce_logits says; a label
// other than 0 or 1 makes its row NaN.
void bce_logits(const Launch& l, const float* logits, const std::int32_t* labels, float* dlogits,
                float* loss, float* correct, int n);
// The dot interaction and its backward (Backend::dot_interaction_forward):
// one thread per output element.
void dot_interaction_forward(const Launch& l, const float* x, float* y, const InteractionShape& s);
void dot_interaction_backward(const Launch& l, const float* x, const float* dy, float* dx,
                              const InteractionShape& s);

// Embedding lookups and their segment-sum backward, as Backend's
// embedding_forward and embedding_backward say (client/compute/backend.h):
// one thread per output element, summing in the same order as the CPU.
void embedding_forward(const Launch& l, const float* rows, const std::int32_t* inverse, float* out,
                       const EmbeddingShape& s);
void embedding_backward(const Launch& l, const float* dout, const std::int32_t* by_row,
                        const std::int32_t* offsets, float* drows, const EmbeddingShape& s);
// dst[r * dst_stride + c] = src[r * src_stride + c].
void copy_columns(const Launch& l, const float* src, std::size_t src_stride, float* dst,
                  std::size_t dst_stride, std::size_t rows, std::size_t cols);

// out[i] = x[i] in `format` (shared/low_precision.h's rounding): the
// operands of mixed-precision GEMMs.
void encode_halves(const Launch& l, HalfFormat format, const float* x, std::uint16_t* out,
                   std::size_t n);
// *flag = 1 if any of the n floats at x is not finite (*flag is left alone
// otherwise: the caller zeroes it first).
void flag_nonfinite(const Launch& l, const float* x, std::size_t n, int* flag);

// Tests: one thread that spins until *flag (device-readable host memory) is
// non-zero or `limit_ns` nanoseconds have passed.
void hold(const Launch& l, const std::int32_t* flag, unsigned long long limit_ns);

// The fields of an OptimizerStep that change from one update to the next,
// in device memory for a replayed CUDA graph to read (client/compute/cuda/step_graph.h).
struct LiveStep {
  float lr, bias1, bias2;
  static LiveStep of(const opt::OptimizerStep& s) { return {s.lr, s.bias1, s.bias2}; }
};

// One optimizer step over step.n elements, through the dispatch the CPU's
// Optimizer uses (shared/optimizer_math.h). Non-null `live` overrides the
// step's LiveStep fields on the device.
void optimizer(const Launch& l, const opt::OptimizerStep& step, const LiveStep* live, float* w,
               const float* g, float* state);
// The same step on `count` tensors, each with its own size (step.n is
// ignored): one launch per kMultiTensor of them, their pointers and sizes
// passed by value as kernel arguments, so nothing is allocated or copied
// and the launches can be captured in a CUDA graph (`live` as above).
constexpr std::size_t kMultiTensor = 32;
void optimizers(const Launch& l, const opt::OptimizerStep& step, const LiveStep* live,
                const OptimizerTensor* tensors, std::size_t count);

}  // namespace pstrain::cuda::kernels
