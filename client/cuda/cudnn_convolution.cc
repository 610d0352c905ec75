#include "client/cuda/cudnn_convolution.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define PSTRAIN_HAVE_CUDNN_HEADERS 1
#else
#define PSTRAIN_HAVE_CUDNN_HEADERS 0
#endif

namespace pstrain::cuda {

#if PSTRAIN_HAVE_CUDNN_HEADERS

// The cuDNN entry points the backend calls, resolved from the loaded library
// with the header's signatures.
struct CudnnConvolutions::Library {
#define PSTRAIN_CUDNN_FUNCTIONS(X)                  \
  X(cudnnGetVersion)                                \
  X(cudnnGetErrorString)                            \
  X(cudnnCreate)                                    \
  X(cudnnDestroy)                                   \
  X(cudnnSetStream)                                 \
  X(cudnnCreateTensorDescriptor)                    \
  X(cudnnSetTensor4dDescriptor)                     \
  X(cudnnDestroyTensorDescriptor)                   \
  X(cudnnCreateFilterDescriptor)                    \
  X(cudnnSetFilter4dDescriptor)                     \
  X(cudnnDestroyFilterDescriptor)                   \
  X(cudnnCreateConvolutionDescriptor)               \
  X(cudnnSetConvolution2dDescriptor)                \
  X(cudnnSetConvolutionMathType)                    \
  X(cudnnDestroyConvolutionDescriptor)              \
  X(cudnnCreateActivationDescriptor)                \
  X(cudnnSetActivationDescriptor)                   \
  X(cudnnDestroyActivationDescriptor)               \
  X(cudnnGetConvolutionForwardWorkspaceSize)        \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)   \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize) \
  X(cudnnConvolutionBiasActivationForward)          \
  X(cudnnConvolutionBackwardData)                   \
  X(cudnnConvolutionBackwardFilter)                 \
  X(cudnnConvolutionBackwardBias)
#define PSTRAIN_CUDNN_DECLARE(name) decltype(&::name) name = nullptr;
  PSTRAIN_CUDNN_FUNCTIONS(PSTRAIN_CUDNN_DECLARE)
#undef PSTRAIN_CUDNN_DECLARE

  void check(cudnnStatus_t status, const char* call) const {
    if (status != CUDNN_STATUS_SUCCESS)
      throw CudaError(std::string(call) + " failed: " + cudnnGetErrorString(status));
  }
};

namespace {

// The deterministic algorithms (the others may sum in a varying order).
// Implicit precomputed GEMM is also the one the fused bias epilogue takes
// with the identity activation.
constexpr cudnnConvolutionFwdAlgo_t kForward = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
constexpr cudnnConvolutionBwdDataAlgo_t kBackwardData = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
constexpr cudnnConvolutionBwdFilterAlgo_t kBackwardFilter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;

}  // namespace

const CudnnConvolutions::Library* CudnnConvolutions::load(std::string& why_not) {
  static std::string failure;
  static const auto* library = []() -> const Library* {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("PSTRAIN_CUDNN_LIB"); env && *env)
      candidates.emplace_back(env);
    candidates.emplace_back("libcudnn.so.9");
    candidates.emplace_back(PSTRAIN_CUDA_LIBRARY_DIR "/libcudnn.so.9");
    void* handle = nullptr;
    for (const auto& path : candidates) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      const char* error = dlerror();
      failure += (failure.empty() ? "" : "; ") + std::string(error ? error : path);
    }
    if (!handle) return nullptr;
    // Stays loaded for the life of the process, like the CUDA library.
    auto* lib = new Library;
#define PSTRAIN_CUDNN_RESOLVE(name)                                        \
  lib->name = reinterpret_cast<decltype(lib->name)>(dlsym(handle, #name)); \
  if (!lib->name) {                                                        \
    failure = "libcudnn has no " #name;                                    \
    delete lib;                                                            \
    return nullptr;                                                        \
  }
    PSTRAIN_CUDNN_FUNCTIONS(PSTRAIN_CUDNN_RESOLVE)
#undef PSTRAIN_CUDNN_RESOLVE
    if (lib->cudnnGetVersion() < 90000) {
      failure = "libcudnn is version " + std::to_string(lib->cudnnGetVersion()) + ", not 9";
      delete lib;
      return nullptr;
    }
    return lib;
  }();
  if (!library) why_not = failure;
  return library;
}

// The descriptors of one shape and its workspace size.
struct CudnnConvolutions::Shape {
  const Library& lib;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t identity = nullptr, relu = nullptr;
  std::size_t workspace = 0;

  explicit Shape(const Library& l) : lib(l) {}
  ~Shape() {
    // Destroying a descriptor cannot fail in a way worth reporting here.
    if (x) lib.cudnnDestroyTensorDescriptor(x);
    if (y) lib.cudnnDestroyTensorDescriptor(y);
    if (bias) lib.cudnnDestroyTensorDescriptor(bias);
    if (w) lib.cudnnDestroyFilterDescriptor(w);
    if (conv) lib.cudnnDestroyConvolutionDescriptor(conv);
    if (identity) lib.cudnnDestroyActivationDescriptor(identity);
    if (relu) lib.cudnnDestroyActivationDescriptor(relu);
  }
};

#define PSTRAIN_CUDNN_CHECK(call) lib_.check((lib_.call), #call)

std::unique_ptr<CudnnConvolutions> CudnnConvolutions::make(cudaStream_t stream,
                                                           std::string& why_not) {
  if (const char* env = std::getenv("PSTRAIN_CUDNN_LIB"); env && std::string_view(env) == "off") {
    why_not = "PSTRAIN_CUDNN_LIB=off";
    return nullptr;
  }
  const Library* lib = load(why_not);
  if (!lib) return nullptr;
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t created = lib->cudnnCreate(&handle);
  if (created != CUDNN_STATUS_SUCCESS) {
    why_not = std::string("cudnnCreate failed: ") + lib->cudnnGetErrorString(created);
    return nullptr;
  }
  std::unique_ptr<CudnnConvolutions> convolutions(new CudnnConvolutions(*lib, handle));
  lib->check(lib->cudnnSetStream(handle, stream), "cudnnSetStream");
  return convolutions;
}

CudnnConvolutions::CudnnConvolutions(const Library& lib, void* handle)
    : lib_(lib), handle_(handle) {}

CudnnConvolutions::~CudnnConvolutions() {
  shapes_.clear();
  lib_.cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

std::string CudnnConvolutions::version() const {
  const std::size_t v = lib_.cudnnGetVersion();  // major * 10000 + minor * 100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

CudnnConvolutions::Shape& CudnnConvolutions::shape(const ConvShape& s) {
  auto& slot = shapes_[{s.n, s.c, s.h, s.w, s.filters, s.kernel}];
  if (slot) return *slot;
  auto d = std::make_unique<Shape>(lib_);
  PSTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->x));
  PSTRAIN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s.n, s.c, s.h, s.w));
  PSTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->y));
  PSTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s.n,
                                                 s.filters, s.out_h(), s.out_w()));
  PSTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->bias));
  PSTRAIN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(d->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, s.filters, 1, 1));
  PSTRAIN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d->w));
  PSTRAIN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                 s.filters, s.c, s.kernel, s.kernel));
  // Stride 1, no padding, cross-correlation (the backend's convention).
  PSTRAIN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d->conv));
  PSTRAIN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d->conv, 0, 0, 1, 1, 1, 1,
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  PSTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(d->conv, CUDNN_FMA_MATH));
  PSTRAIN_CUDNN_CHECK(cudnnCreateActivationDescriptor(&d->identity));
  PSTRAIN_CUDNN_CHECK(cudnnSetActivationDescriptor(d->identity, CUDNN_ACTIVATION_IDENTITY,
                                                   CUDNN_NOT_PROPAGATE_NAN, 0));
  PSTRAIN_CUDNN_CHECK(cudnnCreateActivationDescriptor(&d->relu));
  PSTRAIN_CUDNN_CHECK(
      cudnnSetActivationDescriptor(d->relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0));
  auto* handle = static_cast<cudnnHandle_t>(handle_);
  std::size_t forward = 0, data = 0, filter = 0;
  PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, d->x, d->w, d->conv, d->y,
                                                              kForward, &forward));
  PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d->w, d->y, d->conv,
                                                                   d->x, kBackwardData, &data));
  PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
      handle, d->x, d->y, d->conv, d->w, kBackwardFilter, &filter));
  d->workspace = std::max({forward, data, filter});
  slot = std::move(d);
  return *slot;
}

std::size_t CudnnConvolutions::workspace_bytes(const ConvShape& s) { return shape(s).workspace; }

void CudnnConvolutions::forward(const float* x, const float* w, const float* b, float* y,
                                void* workspace, std::size_t workspace_bytes, const ConvShape& s,
                                bool relu) {
  Shape& d = shape(s);
  check_dims(workspace_bytes >= d.workspace, "conv2d_forward", "workspace too small for cuDNN");
  const float one = 1.0f, zero = 0.0f;
  // y = act(1 * conv(x, w) + 0 * y + b): the bias and the activation in the
  // epilogue (cuDNN fuses a relu with this algorithm only, which we use).
  PSTRAIN_CUDNN_CHECK(cudnnConvolutionBiasActivationForward(
      static_cast<cudnnHandle_t>(handle_), &one, d.x, x, d.w, w, d.conv, kForward, workspace,
      workspace_bytes, &zero, d.y, y, d.bias, b, relu ? d.relu : d.identity, d.y, y));
}

void CudnnConvolutions::backward(const float* x, const float* w, const float* dy, float* dx,
                                 float* dw, float* db, void* workspace, std::size_t workspace_bytes,
                                 const ConvShape& s) {
  Shape& d = shape(s);
  check_dims(workspace_bytes >= d.workspace, "conv2d_backward", "workspace too small for cuDNN");
  auto* handle = static_cast<cudnnHandle_t>(handle_);
  const float one = 1.0f, zero = 0.0f;
  PSTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardBias(handle, &one, d.y, dy, &zero, d.bias, db));
  PSTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &one, d.x, x, d.y, dy, d.conv,
                                                     kBackwardFilter, workspace, workspace_bytes,
                                                     &zero, d.w, dw));
  if (dx)
    PSTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, d.w, w, d.y, dy, d.conv,
                                                     kBackwardData, workspace, workspace_bytes,
                                                     &zero, d.x, dx));
}

#else  // no cuDNN headers at build time: always the im2col path

struct CudnnConvolutions::Library {};
struct CudnnConvolutions::Shape {};

std::unique_ptr<CudnnConvolutions> CudnnConvolutions::make(cudaStream_t, std::string& why_not) {
  why_not = "built without cuDNN headers";
  return nullptr;
}
CudnnConvolutions::~CudnnConvolutions() = default;
std::string CudnnConvolutions::version() const { return {}; }
std::size_t CudnnConvolutions::workspace_bytes(const ConvShape&) { return 0; }
void CudnnConvolutions::forward(const float*, const float*, const float*, float*, void*,
                                std::size_t, const ConvShape&, bool) {}
void CudnnConvolutions::backward(const float*, const float*, const float*, float*, float*, float*,
                                 void*, std::size_t, const ConvShape&) {}

#endif

}  // namespace pstrain::cuda
