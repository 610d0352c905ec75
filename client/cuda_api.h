#pragma once
// The C ABI between `pstrain` and libpstrain_cuda.so. The library is loaded
// with dlopen only when a worker asks for a GPU, so a ps (or a CPU worker)
// starts on a host without CUDA libraries. Objects cross the boundary as raw
// pointers to the C++ interfaces and are owned by unique_ptr on the caller's
// side at once (client/cuda_loader.h); both sides share one libstdc++.
#include <cstddef>
#include <cstdint>

namespace pstrain {
class Backend;
class Communicator;
}  // namespace pstrain

// Bumped whenever a signature below or the Backend interface changes.
#define PSTRAIN_CUDA_ABI_VERSION 4

extern "C" {
int pstrain_cuda_abi_version();
// The architectures the library was compiled for, e.g. "75;80;90+PTX".
const char* pstrain_cuda_architectures();
// Number of visible devices (honours CUDA_VISIBLE_DEVICES), or -1 with the
// CUDA error text in `error` when the driver or a device is missing.
int pstrain_cuda_device_count(char* error, std::size_t error_size);
// A backend on `device`; nullptr with the reason in `error`.
pstrain::Backend* pstrain_cuda_create_backend(int device, char* error, std::size_t error_size);
// For tests: enqueues on `backend`'s compute stream a kernel that spins until
// *flag is non-zero (for 60 s at most, so a test that fails before it sets
// the flag leaves no kernel spinning), so fences and transfer order can be
// checked against work that is really pending. `flag` lies in memory from
// backend->alloc_host (pinned, which the device reads). Returns 0 on success.
int pstrain_cuda_hold_compute(pstrain::Backend* backend, const std::int32_t* flag, char* error,
                              std::size_t error_size);
// NCCL's unique id (128 bytes); works without a GPU. Returns 0 on success.
int pstrain_nccl_unique_id(std::uint8_t* id, std::size_t id_size, char* error,
                           std::size_t error_size);
// An NCCL communicator on `backend`'s compute stream (a backend made by this
// library, which must outlive it). A peer that does not join, dies or hangs
// for `timeout_s` seconds becomes a CommError instead of a hang.
pstrain::Communicator* pstrain_nccl_create(pstrain::Backend* backend, const std::uint8_t* id,
                                           std::size_t id_size, int rank, int size,
                                           double timeout_s, char* error, std::size_t error_size);
}
