#include "client/compute/cuda/cudnn_convolution.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "client/compute/cuda/cuda_memory.h"

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
#define PSTRAIN_CUDNN_FUNCTIONS(X)                      \
  X(cudnnGetVersion)                                    \
  X(cudnnGetCudartVersion)                              \
  X(cudnnGetErrorString)                                \
  X(cudnnCreate)                                        \
  X(cudnnDestroy)                                       \
  X(cudnnSetStream)                                     \
  X(cudnnCreateTensorDescriptor)                        \
  X(cudnnSetTensor4dDescriptor)                         \
  X(cudnnDestroyTensorDescriptor)                       \
  X(cudnnCreateFilterDescriptor)                        \
  X(cudnnSetFilter4dDescriptor)                         \
  X(cudnnDestroyFilterDescriptor)                       \
  X(cudnnCreateConvolutionDescriptor)                   \
  X(cudnnSetConvolution2dDescriptor)                    \
  X(cudnnSetConvolutionMathType)                        \
  X(cudnnDestroyConvolutionDescriptor)                  \
  X(cudnnCreateActivationDescriptor)                    \
  X(cudnnSetActivationDescriptor)                       \
  X(cudnnDestroyActivationDescriptor)                   \
  X(cudnnActivationForward)                             \
  X(cudnnGetConvolutionForwardAlgorithmMaxCount)        \
  X(cudnnGetConvolutionBackwardDataAlgorithmMaxCount)   \
  X(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount) \
  X(cudnnGetConvolutionForwardAlgorithm_v7)             \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)        \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)      \
  X(cudnnGetConvolutionForwardWorkspaceSize)            \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)       \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize)     \
  X(cudnnConvolutionBiasActivationForward)              \
  X(cudnnConvolutionBackwardData)                       \
  X(cudnnConvolutionBackwardFilter)                     \
  X(cudnnConvolutionBackwardBias)
#define PSTRAIN_CUDNN_DECLARE(name) decltype(&::name) name = nullptr;
  PSTRAIN_CUDNN_FUNCTIONS(PSTRAIN_CUDNN_DECLARE)
#undef PSTRAIN_CUDNN_DECLARE
  std::string path;  // where it was loaded from

  void check(cudnnStatus_t status, const char* call) const {
    if (status != CUDNN_STATUS_SUCCESS)
      throw CudaError(std::string(call) + " failed: " + cudnnGetErrorString(status));
  }
};

namespace {

// "13.0" from a CUDA version number (major * 1000 + minor * 10).
std::string cuda_version_text(std::size_t v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// "9.19.0" from cuDNN's version number (major * 10000 + minor * 100 + patch).
std::string cudnn_version_text(std::size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// The algorithm cuDNN's heuristics rank first among those that run at this
// shape, always sum in the same order and compute in FMA (TF32 would round
// the operands): `perf` as cudnnGet*Algorithm_v7 fills it, best first.
template <class Perf>
std::optional<Perf> first_usable(const std::vector<Perf>& perf, int returned) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC &&
        (p.mathType == CUDNN_FMA_MATH || p.mathType == CUDNN_DEFAULT_MATH))
      return p;
  }
  return std::nullopt;
}

}  // namespace

// Loads once per $PSTRAIN_CUDNN_LIB value (tests change it between
// backends); the outcome, library or reason, is kept for the process.
const CudnnConvolutions::Library* CudnnConvolutions::load(std::string& why_not) {
  struct Outcome {
    const Library* library = nullptr;
    std::string failure;
  };
  static std::mutex mutex;
  static std::map<std::string, Outcome> outcomes;
  const char* env = std::getenv("PSTRAIN_CUDNN_LIB");
  const std::string wanted = env ? env : "";
  const std::lock_guard lock(mutex);
  auto [at, fresh] = outcomes.try_emplace(wanted);
  Outcome& outcome = at->second;
  if (fresh)
    outcome.library = [&wanted, &failure = outcome.failure]() -> const Library* {
      std::vector<std::string> candidates;
      if (!wanted.empty()) candidates.push_back(wanted);
      candidates.emplace_back("libcudnn.so.9");
      candidates.emplace_back(PSTRAIN_CUDA_LIBRARY_DIR "/libcudnn.so.9");
      void* handle = nullptr;
      std::string path;
      for (const auto& candidate : candidates) {
        handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle) {
          path = candidate;
          break;
        }
        const char* error = dlerror();
        failure += (failure.empty() ? "" : "; ") + std::string(error ? error : candidate);
      }
      if (!handle) return nullptr;
      // Stays loaded for the life of the process, like the CUDA library.
      auto lib = std::make_unique<Library>();
      lib->path = path;
#define PSTRAIN_CUDNN_RESOLVE(name)                                        \
  lib->name = reinterpret_cast<decltype(lib->name)>(dlsym(handle, #name)); \
  if (!lib->name) {                                                        \
    failure = path + " has no " #name;                                     \
    return nullptr;                                                        \
  }
      // The versions first: a library of another version may lack the rest.
      PSTRAIN_CUDNN_RESOLVE(cudnnGetVersion)
      PSTRAIN_CUDNN_RESOLVE(cudnnGetCudartVersion)
      if (lib->cudnnGetVersion() < 90000) {
        failure = path + " is version " + std::to_string(lib->cudnnGetVersion()) + ", not 9";
        return nullptr;
      }
      // A cuDNN for another CUDA major version loads but fails its first call
      // on this runtime's streams and memory.
      if (const std::size_t built_for = lib->cudnnGetCudartVersion();
          built_for / 1000 != CUDART_VERSION / 1000) {
        failure = path + " was built for CUDA " + cuda_version_text(built_for) +
                  ", this library for CUDA " + cuda_version_text(CUDART_VERSION);
        return nullptr;
      }
      PSTRAIN_CUDNN_FUNCTIONS(PSTRAIN_CUDNN_RESOLVE)
#undef PSTRAIN_CUDNN_RESOLVE
      return lib.release();
    }();
  if (!outcome.library) why_not = outcome.failure;
  return outcome.library;
}

bool CudnnConvolutions::library_status(std::string& text) {
  if (const char* env = std::getenv("PSTRAIN_CUDNN_LIB"); env && std::string_view(env) == "off") {
    text = "PSTRAIN_CUDNN_LIB=off";
    return false;
  }
  const Library* lib = load(text);
  if (!lib) return false;
  text = cudnn_version_text(lib->cudnnGetVersion()) + " for CUDA " +
         cuda_version_text(lib->cudnnGetCudartVersion()) + " from " + lib->path;
  return true;
}

// The descriptors and algorithms of one shape, and its workspace size.
struct CudnnConvolutions::Shape {
  const Library& lib;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t identity = nullptr, relu = nullptr;
  cudnnConvolutionFwdAlgo_t forward{};
  cudnnConvolutionBwdDataAlgo_t data{};
  cudnnConvolutionBwdFilterAlgo_t filter{};
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
  if (!library_status(why_not)) return nullptr;
  const Library* lib = load(why_not);
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t created = lib->cudnnCreate(&handle);
  if (created != CUDNN_STATUS_SUCCESS) {
    why_not = std::string("cudnnCreate failed: ") + lib->cudnnGetErrorString(created);
    return nullptr;
  }
  std::unique_ptr<CudnnConvolutions> convolutions(new CudnnConvolutions(*lib, handle, stream));
  try {
    lib->check(lib->cudnnSetStream(handle, stream), "cudnnSetStream");
    convolutions->probe();
  } catch (const std::exception& e) {
    why_not = lib->path + " loads but cannot run here: " + e.what();
    // A failed kernel may leave its error as the last one: clear it, so the
    // backend's next launch check does not report it.
    (void)cudaGetLastError();
    return nullptr;
  }
  return convolutions;
}

void CudnnConvolutions::probe() {
  const ConvShape s{.n = 2, .c = 2, .h = 5, .w = 5, .filters = 3, .kernel = 3};
  if (std::string why; !shape(s, &why)) throw CudaError(why);
  const std::size_t in = std::size_t(s.n) * s.c * s.h * s.w;
  const std::size_t out = std::size_t(s.n) * s.filters * s.out_h() * s.out_w();
  const std::size_t filter = std::size_t(s.filters) * s.c * s.kernel * s.kernel;
  const std::size_t bytes = std::max<std::size_t>(workspace_bytes(s), 1);
  auto x = device_buffer<float>(in), dx = device_buffer<float>(in);
  auto y = device_buffer<float>(out), w = device_buffer<float>(filter);
  auto dw = device_buffer<float>(filter), b = device_buffer<float>(s.filters);
  auto db = device_buffer<float>(s.filters);
  auto workspace = device_buffer<std::byte>(bytes);
  for (auto& [p, n] : {std::pair{x.get(), in}, std::pair{w.get(), filter},
                       std::pair{b.get(), std::size_t(s.filters)}})
    PSTRAIN_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  forward(x.get(), w.get(), b.get(), y.get(), workspace.get(), bytes, s, false);
  forward(x.get(), w.get(), b.get(), y.get(), workspace.get(), bytes, s, true);
  backward(x.get(), w.get(), y.get(), dx.get(), dw.get(), db.get(), workspace.get(), bytes, s);
  PSTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudnnConvolutions::CudnnConvolutions(const Library& lib, void* handle, cudaStream_t stream)
    : lib_(lib), handle_(handle), stream_(stream) {}

CudnnConvolutions::~CudnnConvolutions() {
  shapes_.clear();
  lib_.cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

std::string CudnnConvolutions::version() const {
  return cudnn_version_text(lib_.cudnnGetVersion());
}

bool CudnnConvolutions::supports(const ConvShape& s) {
  std::string why;
  const Shape* d = shape(s, &why);
  if (!why.empty())
    std::fprintf(stderr,
                 "pstrain cuda: cuDNN cannot serve the convolution %s (%s): it takes the "
                 "im2col path\n",
                 to_string(s).c_str(), why.c_str());
  return d != nullptr;
}

CudnnConvolutions::Shape* CudnnConvolutions::shape(const ConvShape& s, std::string* why_not) {
  const auto key = std::tuple{s.n, s.c, s.h, s.w, s.filters, s.kernel};
  if (const auto found = shapes_.find(key); found != shapes_.end()) return found->second.get();
  auto d = std::make_unique<Shape>(lib_);
  auto* handle = static_cast<cudnnHandle_t>(handle_);
  std::string why;
  try {
    PSTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->x));
    PSTRAIN_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s.n, s.c, s.h, s.w));
    PSTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->y));
    PSTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s.n,
                                                   s.filters, s.out_h(), s.out_w()));
    PSTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->bias));
    PSTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                                                   s.filters, 1, 1));
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
    int count = 0, returned = 0;
    PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> forward(std::max(count, 1));
    PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        handle, d->x, d->w, d->conv, d->y, int(forward.size()), &returned, forward.data()));
    const auto f = first_usable(forward, returned);
    PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> data(std::max(count, 1));
    PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle, d->w, d->y, d->conv, d->x, int(data.size()), &returned, data.data()));
    const auto bd = first_usable(data, returned);
    PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> filter(std::max(count, 1));
    PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle, d->x, d->y, d->conv, d->w, int(filter.size()), &returned, filter.data()));
    const auto bf = first_usable(filter, returned);
    if (!f || !bd || !bf) {
      why = std::string("no deterministic FMA algorithm for the ") + (!f    ? "forward pass"
                                                                      : !bd ? "data gradient"
                                                                            : "filter gradient");
    } else {
      d->forward = f->algo;
      d->data = bd->algo;
      d->filter = bf->algo;
      std::size_t fw = 0, dw = 0, fl = 0;
      PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, d->x, d->w, d->conv, d->y,
                                                                  d->forward, &fw));
      PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d->w, d->y, d->conv,
                                                                       d->x, d->data, &dw));
      PSTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, d->x, d->y, d->conv, d->w, d->filter, &fl));
      d->workspace = std::max({fw, dw, fl});
    }
  } catch (const CudaError& e) {  // CUDNN_STATUS_NOT_SUPPORTED and the like
    why = e.what();
  }
  auto& slot = shapes_[key];
  if (why.empty()) {
    slot = std::move(d);
  } else if (why_not) {
    *why_not = why;
  }
  return slot.get();
}

CudnnConvolutions::Shape& CudnnConvolutions::supported(const ConvShape& s, const char* op) {
  Shape* d = shape(s);
  check_dims(d != nullptr, op, "cuDNN cannot serve the shape " + to_string(s));
  return *d;
}

std::size_t CudnnConvolutions::workspace_bytes(const ConvShape& s) {
  return supported(s, "conv2d_workspace").workspace;
}

void CudnnConvolutions::forward(const float* x, const float* w, const float* b, float* y,
                                void* workspace, std::size_t workspace_bytes, const ConvShape& s,
                                bool relu) {
  Shape& d = supported(s, "conv2d_forward");
  check_dims(workspace_bytes >= d.workspace, "conv2d_forward", "workspace too small for cuDNN");
  auto* handle = static_cast<cudnnHandle_t>(handle_);
  const float one = 1.0f, zero = 0.0f;
  // y = act(1 * conv(x, w) + 0 * y + b): the bias and the activation in the
  // epilogue, where cuDNN fuses the relu (the implicit precomputed GEMM only).
  const bool fused = !relu || d.forward == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  PSTRAIN_CUDNN_CHECK(cudnnConvolutionBiasActivationForward(
      handle, &one, d.x, x, d.w, w, d.conv, d.forward, workspace, workspace_bytes, &zero, d.y, y,
      d.bias, b, relu && fused ? d.relu : d.identity, d.y, y));
  if (!fused)
    PSTRAIN_CUDNN_CHECK(cudnnActivationForward(handle, d.relu, &one, d.y, y, &zero, d.y, y));
}

void CudnnConvolutions::backward(const float* x, const float* w, const float* dy, float* dx,
                                 float* dw, float* db, void* workspace, std::size_t workspace_bytes,
                                 const ConvShape& s) {
  Shape& d = supported(s, "conv2d_backward");
  check_dims(workspace_bytes >= d.workspace, "conv2d_backward", "workspace too small for cuDNN");
  auto* handle = static_cast<cudnnHandle_t>(handle_);
  const float one = 1.0f, zero = 0.0f;
  PSTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardBias(handle, &one, d.y, dy, &zero, d.bias, db));
  PSTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      handle, &one, d.x, x, d.y, dy, d.conv, d.filter, workspace, workspace_bytes, &zero, d.w, dw));
  if (dx)
    PSTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, d.w, w, d.y, dy, d.conv, d.data,
                                                     workspace, workspace_bytes, &zero, d.x, dx));
}

#else  // no cuDNN headers at build time: always the im2col path

struct CudnnConvolutions::Library {};
struct CudnnConvolutions::Shape {};

std::unique_ptr<CudnnConvolutions> CudnnConvolutions::make(cudaStream_t, std::string& why_not) {
  library_status(why_not);
  return nullptr;
}
bool CudnnConvolutions::library_status(std::string& text) {
  text = "built without cuDNN headers";
  return false;
}
bool CudnnConvolutions::supports(const ConvShape&) { return false; }
CudnnConvolutions::~CudnnConvolutions() = default;
std::string CudnnConvolutions::version() const { return {}; }
std::size_t CudnnConvolutions::workspace_bytes(const ConvShape&) { return 0; }
void CudnnConvolutions::forward(const float*, const float*, const float*, float*, void*,
                                std::size_t, const ConvShape&, bool) {}
void CudnnConvolutions::backward(const float*, const float*, const float*, float*, float*, float*,
                                 void*, std::size_t, const ConvShape&) {}

#endif

}  // namespace pstrain::cuda
