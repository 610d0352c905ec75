// The C ABI of client/compute/cuda_api.h. Exceptions never cross it: each entry point
// turns one into a null/negative result and the message in `error`.
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>

#include "client/compute/cuda/cuda_backend.h"
#include "client/compute/cuda/cudnn_convolution.h"
#include "client/compute/cuda/nccl_communicator.h"
#include "cuda_abi_hash.h"
#include "cuda_build_info.h"

// The library is built with hidden visibility; only these symbols are its
// interface.
#pragma GCC visibility push(default)
#include "client/compute/cuda_api.h"
#pragma GCC visibility pop

namespace {

void set_error(char* error, std::size_t size, const char* text) {
  if (error && size > 0) std::snprintf(error, size, "%s", text);
}

template <class F>
auto guarded(char* error, std::size_t size, decltype(std::declval<F>()()) failed, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    set_error(error, size, e.what());
  } catch (...) {
    set_error(error, size, "unknown exception");
  }
  return failed;
}

}  // namespace

extern "C" {

int pstrain_cuda_abi_version() { return PSTRAIN_CUDA_ABI_VERSION; }

const char* pstrain_cuda_abi_hash() { return PSTRAIN_CUDA_ABI_HASH; }

int pstrain_cudnn_status(char* text, std::size_t text_size) {
  std::string status;
  const bool usable = guarded(text, text_size, false, [&] {
    return pstrain::cuda::CudnnConvolutions::library_status(status);
  });
  if (!status.empty()) set_error(text, text_size, status.c_str());
  return usable ? 1 : 0;
}

const char* pstrain_cuda_architectures() { return PSTRAIN_CUDA_ARCHITECTURES_TEXT; }

int pstrain_cuda_device_count(char* error, std::size_t error_size) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    set_error(error, error_size,
              (std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(status) + " (" +
               cudaGetErrorName(status) + ")")
                  .c_str());
    return -1;
  }
  return count;
}

pstrain::Backend* pstrain_cuda_create_backend(int device, char* error, std::size_t error_size) {
  return guarded(error, error_size, static_cast<pstrain::Backend*>(nullptr), [&] {
    return static_cast<pstrain::Backend*>(
        std::make_unique<pstrain::cuda::CudaBackend>(device).release());
  });
}

int pstrain_cuda_hold_compute(pstrain::Backend* backend, const std::int32_t* flag, char* error,
                              std::size_t error_size) {
  return guarded(error, error_size, -1, [&] {
    auto* cuda = dynamic_cast<pstrain::cuda::CudaBackend*>(backend);
    if (!cuda) throw std::invalid_argument("hold_compute needs a CUDA backend");
    cuda->hold_compute(flag);
    return 0;
  });
}

int pstrain_nccl_unique_id(std::uint8_t* id, std::size_t id_size, char* error,
                           std::size_t error_size) {
  return guarded(error, error_size, -1, [&] {
    if (id_size != sizeof(ncclUniqueId)) {
      throw std::invalid_argument("nccl unique id buffer has " + std::to_string(id_size) +
                                  " bytes, NCCL needs " + std::to_string(sizeof(ncclUniqueId)));
    }
    ncclUniqueId unique{};
    PSTRAIN_CUDA_CHECK(ncclGetUniqueId(&unique));
    std::memcpy(id, &unique, sizeof(unique));
    return 0;
  });
}

pstrain::Communicator* pstrain_nccl_create(pstrain::Backend* backend, const std::uint8_t* id,
                                           std::size_t id_size, int rank, int size,
                                           double timeout_s, char* error, std::size_t error_size) {
  return guarded(error, error_size, static_cast<pstrain::Communicator*>(nullptr), [&] {
    auto* cuda = dynamic_cast<pstrain::cuda::CudaBackend*>(backend);
    if (!cuda) {
      throw std::invalid_argument("nccl needs a CUDA backend, got " +
                                  (backend ? backend->name() : std::string("none")));
    }
    if (id_size != sizeof(ncclUniqueId)) {
      throw std::invalid_argument("nccl unique id has " + std::to_string(id_size) +
                                  " bytes, expected " + std::to_string(sizeof(ncclUniqueId)));
    }
    ncclUniqueId unique{};
    std::memcpy(&unique, id, sizeof(unique));
    return static_cast<pstrain::Communicator*>(
        std::make_unique<pstrain::cuda::NcclCommunicator>(*cuda, unique, rank, size, timeout_s)
            .release());
  });
}

}  // extern "C"
