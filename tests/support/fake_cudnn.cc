// Stand-ins for libcudnn.so.9, all reporting version 9.19.0 built for CUDA
// PSTRAIN_FAKE_CUDART_VERSION:
//   - by default nothing else: a cuDNN for another CUDA major version, or
//     (with the right version) a library missing its entry points;
//   - with PSTRAIN_FAKE_SUBLIBRARY_MISSING, every entry point the CUDA
//     backend resolves, where a handle is made but every descriptor and
//     convolution call fails with CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED: a
//     partial installation, whose cnn and ops libraries are not there, which
//     only running it (the backend's probe) can tell.
// For what `pstrain --version` and the CUDA backend make of them. Built
// without cuDNN's headers; the calls' arguments are ignored, so each is
// declared variadic and returns cuDNN's status as an int.
#include <cstddef>

#define PSTRAIN_FAKE extern "C" __attribute__((visibility("default")))

PSTRAIN_FAKE std::size_t cudnnGetVersion() { return 91900; }
PSTRAIN_FAKE std::size_t cudnnGetCudartVersion() { return PSTRAIN_FAKE_CUDART_VERSION; }

#ifdef PSTRAIN_FAKE_SUBLIBRARY_MISSING
namespace {
constexpr int kSuccess = 0;
constexpr int kSublibraryLoadingFailed = 1008;  // CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED
int handle_storage;
}  // namespace

PSTRAIN_FAKE const char* cudnnGetErrorString(int) {
  return "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED (fake)";
}
PSTRAIN_FAKE int cudnnCreate(void** handle) {
  *handle = &handle_storage;
  return kSuccess;
}
PSTRAIN_FAKE int cudnnDestroy(...) { return kSuccess; }
PSTRAIN_FAKE int cudnnSetStream(...) { return kSuccess; }

#define PSTRAIN_FAKE_FAILING(name) \
  PSTRAIN_FAKE int name(...) { return kSublibraryLoadingFailed; }
PSTRAIN_FAKE_FAILING(cudnnCreateTensorDescriptor)
PSTRAIN_FAKE_FAILING(cudnnSetTensor4dDescriptor)
PSTRAIN_FAKE_FAILING(cudnnDestroyTensorDescriptor)
PSTRAIN_FAKE_FAILING(cudnnCreateFilterDescriptor)
PSTRAIN_FAKE_FAILING(cudnnSetFilter4dDescriptor)
PSTRAIN_FAKE_FAILING(cudnnDestroyFilterDescriptor)
PSTRAIN_FAKE_FAILING(cudnnCreateConvolutionDescriptor)
PSTRAIN_FAKE_FAILING(cudnnSetConvolution2dDescriptor)
PSTRAIN_FAKE_FAILING(cudnnSetConvolutionMathType)
PSTRAIN_FAKE_FAILING(cudnnDestroyConvolutionDescriptor)
PSTRAIN_FAKE_FAILING(cudnnCreateActivationDescriptor)
PSTRAIN_FAKE_FAILING(cudnnSetActivationDescriptor)
PSTRAIN_FAKE_FAILING(cudnnDestroyActivationDescriptor)
PSTRAIN_FAKE_FAILING(cudnnActivationForward)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionForwardAlgorithmMaxCount)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionBackwardDataAlgorithmMaxCount)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionForwardAlgorithm_v7)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionBackwardDataAlgorithm_v7)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionBackwardFilterAlgorithm_v7)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionForwardWorkspaceSize)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionBackwardDataWorkspaceSize)
PSTRAIN_FAKE_FAILING(cudnnGetConvolutionBackwardFilterWorkspaceSize)
PSTRAIN_FAKE_FAILING(cudnnConvolutionBiasActivationForward)
PSTRAIN_FAKE_FAILING(cudnnConvolutionBackwardData)
PSTRAIN_FAKE_FAILING(cudnnConvolutionBackwardFilter)
PSTRAIN_FAKE_FAILING(cudnnConvolutionBackwardBias)
#endif
