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
// A library that loads is used only when it can really serve: built for
// the CUDA major version this library uses (cudnnGetCudartVersion), and a
// probe (a tiny forward, fused relu and backward, run to completion) passes,
// which fails where a sub-library (ops, cnn, engines) is missing or cannot
// run here. Otherwise make() returns null with the reason, and the backend
// takes its im2col path and says so once.
//
// Per shape the algorithms are what cuDNN's heuristics
// (cudnnGet*Algorithm_v7) rank first among the deterministic ones that
// compute in FMA (no TF32), so results repeat run to run and stay within
// float tolerance of the reference; a shape with no such algorithm for one
// of its passes, or whose descriptors cuDNN refuses, is unsupported
// (supports()), and the backend takes the im2col path for that shape alone.
// The forward pass adds the bias in the convolution's epilogue
// (cudnnConvolutionBiasActivationForward, which fuses a relu with the
// implicit precomputed GEMM only; with another algorithm the relu is a
// second, in-place pass); the backward pass runs backward data, filter and
// bias.
//
// One CudnnConvolutions belongs to one backend, bound to its compute stream;
// descriptors and algorithms are chosen once per shape, when the model sizes
// its workspace (not inside a step graph's capture). Used from the backend's
// thread only.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "client/compute/backend.h"
#include "client/compute/cuda/cuda_check.h"

namespace pstrain::cuda {

class CudnnConvolutions {
 public:
  // A CudnnConvolutions on `stream`, or null with the reason in `why_not`
  // (cuDNN missing, disabled or failing to start).
  static std::unique_ptr<CudnnConvolutions> make(cudaStream_t stream, std::string& why_not);
  // Whether cuDNN loads and suits this library ("9.19.0 for CUDA 13.0 from
  // libcudnn.so.9" in `text`) or not (the reason), without a device: what
  // `pstrain --version` reports. The probe needs a device and runs in make().
  static bool library_status(std::string& text);
  ~CudnnConvolutions();
  CudnnConvolutions(const CudnnConvolutions&) = delete;
  CudnnConvolutions& operator=(const CudnnConvolutions&) = delete;

  std::string version() const;  // "9.19.0"
  // Whether cuDNN has algorithms for every pass of shape `s`; the first
  // time a shape has none, says why on stderr.
  bool supports(const ConvShape& s);
  // Bytes of workspace the three passes need at shape `s` (supported).
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
  CudnnConvolutions(const Library& lib, void* handle, cudaStream_t stream);
  // The descriptors and algorithms of `s`, chosen once; null when cuDNN
  // cannot serve it, with the reason in *why_not the first time.
  Shape* shape(const ConvShape& s, std::string* why_not = nullptr);
  Shape& supported(const ConvShape& s, const char* op);
  // Runs every pass on a tiny shape and waits for it; throws on failure.
  void probe();

  const Library& lib_;
  void* handle_;  // cudnnHandle_t
  cudaStream_t stream_;
  std::map<std::tuple<int, int, int, int, int, int>, std::unique_ptr<Shape>> shapes_;
};

}  // namespace pstrain::cuda
