#pragma once
// The host side of libpstrain_cuda.so: finds the library, loads it with
// dlopen on first use, checks its ABI version, and hands out its objects
// owned by unique_ptr. A ps or CPU worker never calls these, so it starts on
// a host without CUDA libraries.
//
// The library is looked for next to the running executable (the directory of
// /proc/self/exe, where the build puts it beside `pstrain`) and in that
// directory's parent (for the build tree's bench/ and tests/ programs), then
// at $PSTRAIN_CUDA_LIB. It stays loaded for the life of the process: objects it
// made may be alive until exit.
//
//   auto backend = pstrain::cuda::make_cuda_backend(0);
//   auto id = pstrain::cuda::nccl_unique_id();     // rank 0, shared via ps 0's kv store
//   auto comm = pstrain::cuda::make_nccl_communicator(*backend, id, rank, size);
//
// Every failure to load or start (no library, a library of another version,
// no driver or device) throws CudaUnavailable with the reason; NCCL failures
// (creating a communicator, a peer that dies or hangs later) throw CommError.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "client/comm/communicator.h"
#include "client/compute/backend.h"
#include "shared/error.h"

namespace pstrain::cuda {

struct CudaUnavailable : pstrain::Error {
  using pstrain::Error::Error;
};

using NcclId = std::array<std::uint8_t, 128>;

// The path the library was (or would be) loaded from; throws CudaUnavailable
// when it is in neither place.
std::filesystem::path library_path();

// Loads the library at `path` and checks that it was built from this
// pstrain's interface (ABI version and interface hash); throws
// CudaUnavailable naming the mismatch. What every use of the library does
// first, exposed for tests of the check.
void check_library(const std::filesystem::path& path);

// Whether the CUDA backend's convolutions can use cuDNN on this host, and
// which (version, CUDA version, path), or why not; needs no device.
struct CudnnStatus {
  bool usable = false;
  std::string text;
};
CudnnStatus cudnn_status();

// "75;80;90+PTX": the architectures the library carries code for.
std::string architectures();

// Visible devices (CUDA_VISIBLE_DEVICES applies); throws CudaUnavailable with
// the CUDA error text when there is no driver or device.
int device_count();

std::unique_ptr<Backend> make_cuda_backend(int device);

// NCCL's rendezvous id, made by one rank and given to the others. Needs no GPU.
NcclId nccl_unique_id();

// A communicator over `backend` (made by make_cuda_backend, which must outlive
// it). A peer that does not join, dies or hangs for `timeout_s` seconds ends
// in CommError rather than a hang.
std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, const NcclId& id, int rank,
                                                     int size, double timeout_s = 60);

}  // namespace pstrain::cuda
