#pragma once
// Convolutions through oneDNN (Debian's libdnnl, the library PyTorch's CPU
// convolutions call), for the CPU backend. The caller's tensors stay in the
// backend's layout (NCHW images, OIHW filters, stride 1, no padding); the
// primitives run on layouts their kernels are faster on (channels-last, or
// oneDNN's blocked ones for few input channels), and the data is reordered
// into and out of them around each call. Each batch shape's primitives and
// its reordered buffers are built on first use and kept, since building a
// primitive costs far more than running it at these sizes.
//
// oneDNN runs on OpenMP here; every call first sets the calling thread's
// OpenMP thread count, since that setting belongs to the thread and a
// worker's compute thread is not the one that created the backend.
#include <map>
#include <memory>
#include <tuple>

#include "client/compute/backend.h"

namespace pstrain {

class OnednnConv {
 public:
  explicit OnednnConv(int threads);
  ~OnednnConv();
  OnednnConv(const OnednnConv&) = delete;
  OnednnConv& operator=(const OnednnConv&) = delete;

  // As Backend::conv2d_forward and conv2d_backward, without a workspace;
  // dx may be null.
  void forward(const float* x, const float* w, const float* b, float* y, const ConvShape& s);
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                const ConvShape& s);

 private:
  struct Shape;  // the primitives and buffers of one ConvShape
  Shape& shape(const ConvShape& s);

  int threads_;
  struct Engine;
  std::unique_ptr<Engine> engine_;
  std::map<std::tuple<int, int, int, int, int, int>, std::unique_ptr<Shape>> shapes_;
};

}  // namespace pstrain
