#pragma once
// Dense layers through oneDNN's matmul, for the CPU backend: the three
// products of a dense layer (forward, weight gradient, input gradient) on
// the caller's row-major matrices, transposes expressed as strides, so no
// data is reordered. Each (batch, in, out) shape's primitives are built on
// first use and kept. oneDNN's brgemm kernels ran the MLP preset's products
// (batch 64) 1.5x faster than OpenBLAS 0.3.21's sgemm with the same core
// (best of 9, single thread); threads are set as in client/compute/cpu/onednn_conv.h.
#include <map>
#include <memory>
#include <tuple>

namespace pstrain {

class OnednnDense {
 public:
  explicit OnednnDense(int threads);
  ~OnednnDense();
  OnednnDense(const OnednnDense&) = delete;
  OnednnDense& operator=(const OnednnDense&) = delete;

  // As Backend::dense_forward, and Backend::dense_backward without the
  // bias gradient (a column sum, not a product); dx may be null.
  void forward(const float* x, const float* w, const float* b, float* y, int n, int in, int out);
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, int n,
                int in, int out);

 private:
  struct Shape;  // the primitives of one (n, in, out)
  Shape& shape(int n, int in, int out);

  int threads_;
  struct Engine;
  std::unique_ptr<Engine> engine_;
  std::map<std::tuple<int, int, int>, std::unique_ptr<Shape>> shapes_;
};

}  // namespace pstrain
