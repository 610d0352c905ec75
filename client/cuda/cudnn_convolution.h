#pragma once
// Convolutions through cuDNN, which the CUDA backend uses when it can load
// it and keeps its im2col + cuBLAS path for when it cannot.
//
// cuDNN is not linked: libcudnn.so.9 is loaded with dlopen on first use,
// like libpstrain_cuda.so itself, so the library runs (on the im2col path) on
// a host without cuDNN. It is looked for at $PSTRAIN_CUDNN_LIB (a path, for
// example the copy in PyTorch's wheels; "off" disables cuDNN), then by name
// on the loader's search path (the library's RUNPATH holds the toolkit's
// lib64), then in the toolkit the build used.
//
// The forward pass adds the bias in the convolution's epilogue
// (cudnnConvolutionBiasActivationForward with the identity activation, or
// the relu where the model has one after the convolution); the
// backward pass runs backward data, filter and bias. Every algorithm is a
// deterministic one and the math mode is FMA (no TF32), so results repeat
// run to run and stay within the float tolerance of the reference.
//
// One CudnnConvolutions belongs to one backend, bound to its compute stream;
// descriptors are made once per shape. Used from the backend's thread only.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "client/backend.h"
#include "client/cuda/cuda_check.h"

namespace pstrain::cuda {

class CudnnConvolutions {
 public:
  // A CudnnConvolutions on `stream`, or null with the reason in `why_not`
  // (cuDNN missing, disabled or failing to start).
  static std::unique_ptr<CudnnConvolutions> make(cudaStream_t stream, std::string& why_not);
  ~CudnnConvolutions();
  CudnnConvolutions(const CudnnConvolutions&) = delete;
  CudnnConvolutions& operator=(const CudnnConvolutions&) = delete;

  std::string version() const;  // "9.19.0"
  // Bytes of workspace the three passes need at shape `s`.
  std::size_t workspace_bytes(const ConvShape& s);
  // y = conv(x, w) + b, through a relu when `relu`.
  void forward(const float* x, const float* w, const float* b, float* y, void* workspace,
               std::size_t workspace_bytes, const ConvShape& s, bool relu);
  // dw, db and (when dx is not null) dx, overwritten.
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                void* workspace, std::size_t workspace_bytes, const ConvShape& s);

 private:
  struct Library;
  struct Shape;
  // Loads cuDNN once per process; null with the reason when it cannot.
  static const Library* load(std::string& why_not);
  CudnnConvolutions(const Library& lib, void* handle);
  Shape& shape(const ConvShape& s);

  const Library& lib_;
  void* handle_;  // cudnnHandle_t
  std::map<std::tuple<int, int, int, int, int, int>, std::unique_ptr<Shape>> shapes_;
};

}  // namespace pstrain::cuda
