#include "client/compute/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "client/compute/cuda_api.h"
#include "cuda_abi_hash.h"

namespace pstrain::cuda {
namespace {

constexpr const char* kLibraryName = "libpstrain_cuda.so";

// The library's entry points, resolved once.
struct Library {
  decltype(&pstrain_cuda_abi_version) abi_version = nullptr;
  decltype(&pstrain_cuda_abi_hash) abi_hash = nullptr;
  decltype(&pstrain_cuda_architectures) architectures = nullptr;
  decltype(&pstrain_cudnn_status) cudnn_status = nullptr;
  decltype(&pstrain_cuda_device_count) device_count = nullptr;
  decltype(&pstrain_cuda_create_backend) create_backend = nullptr;
  decltype(&pstrain_nccl_unique_id) nccl_unique_id = nullptr;
  decltype(&pstrain_nccl_create) nccl_create = nullptr;
};

std::filesystem::path find_library() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // Beside the executable (where the build puts pstrain), or one folder up
    // for the build tree's bench/ and tests/ programs.
    for (const auto& dir : {exe.parent_path(), exe.parent_path().parent_path()}) {
      const auto candidate = dir / kLibraryName;
      if (std::filesystem::exists(candidate, ec)) return candidate;
    }
  }
  if (const char* env = std::getenv("PSTRAIN_CUDA_LIB"); env && *env) {
    if (!std::filesystem::exists(env, ec)) {
      throw CudaUnavailable(std::string("PSTRAIN_CUDA_LIB=") + env + " does not exist");
    }
    return env;
  }
  throw CudaUnavailable(
      std::string(kLibraryName) + " not found beside " +
      (exe.empty() ? std::string("the executable") : exe.parent_path().string()) +
      " and PSTRAIN_CUDA_LIB is not set: this pstrain was built without CUDA "
      "(configure with nvcc available), or the library was not installed (package "
      "pstrain-cuda) or copied with it");
}

template <class F>
void resolve(void* handle, const char* symbol, F& out) {
  dlerror();
  void* address = dlsym(handle, symbol);
  if (!address) {
    const char* why = dlerror();
    throw CudaUnavailable(std::string("libpstrain_cuda.so lacks ") + symbol + ": " +
                          (why ? why : "null symbol"));
  }
  out = reinterpret_cast<F>(address);
}

Library load(const std::filesystem::path& path) {
  // RTLD_LOCAL: the CUDA, cuBLAS and NCCL symbols stay out of the global
  // namespace of a process that may have its own.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw CudaUnavailable("dlopen(" + path.string() + ") failed: " + (why ? why : "unknown"));
  }
  Library lib;
  resolve(handle, "pstrain_cuda_abi_version", lib.abi_version);
  if (const int version = lib.abi_version(); version != PSTRAIN_CUDA_ABI_VERSION) {
    throw CudaUnavailable(path.string() + " has ABI version " + std::to_string(version) +
                          ", this pstrain needs " + std::to_string(PSTRAIN_CUDA_ABI_VERSION) +
                          ": rebuild them together");
  }
  // The version is bumped by hand; the hash follows the interface's
  // declarations, so a library built from other ones is refused even where
  // a bump was forgotten. A library without it predates the hash.
  if (!dlsym(handle, "pstrain_cuda_abi_hash")) {
    throw CudaUnavailable(path.string() + " has no interface hash (built before " +
                          "pstrain_cuda_abi_hash existed), this pstrain needs " +
                          PSTRAIN_CUDA_ABI_HASH + ": rebuild them together");
  }
  resolve(handle, "pstrain_cuda_abi_hash", lib.abi_hash);
  if (const std::string hash = lib.abi_hash(); hash != PSTRAIN_CUDA_ABI_HASH) {
    throw CudaUnavailable(path.string() + " was built from other interface headers (hash " + hash +
                          ", this pstrain's " + PSTRAIN_CUDA_ABI_HASH + "): rebuild them together");
  }
  resolve(handle, "pstrain_cuda_architectures", lib.architectures);
  resolve(handle, "pstrain_cudnn_status", lib.cudnn_status);
  resolve(handle, "pstrain_cuda_device_count", lib.device_count);
  resolve(handle, "pstrain_cuda_create_backend", lib.create_backend);
  resolve(handle, "pstrain_nccl_unique_id", lib.nccl_unique_id);
  resolve(handle, "pstrain_nccl_create", lib.nccl_create);
  return lib;
}

// Loads on first use; a failure is remembered and rethrown to later callers
// (dlopen would fail the same way).
const Library& library() {
  static std::once_flag once;
  static Library lib;
  static std::string failure;
  std::call_once(once, [] {
    try {
      lib = load(find_library());
    } catch (const CudaUnavailable& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw CudaUnavailable(failure);
  return lib;
}

struct ErrorText {
  std::array<char, 1024> text{};
  char* data() { return text.data(); }
  std::size_t size() const { return text.size(); }
  std::string str() const { return text.data(); }
};

}  // namespace

std::filesystem::path library_path() { return find_library(); }

void check_library(const std::filesystem::path& path) { load(path); }

CudnnStatus cudnn_status() {
  ErrorText text;
  const bool usable = library().cudnn_status(text.data(), text.size()) == 1;
  return {usable, text.str()};
}

std::string architectures() { return library().architectures(); }

int device_count() {
  ErrorText error;
  const int count = library().device_count(error.data(), error.size());
  if (count < 0) throw CudaUnavailable("no CUDA device: " + error.str());
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  ErrorText error;
  std::unique_ptr<Backend> backend(library().create_backend(device, error.data(), error.size()));
  if (!backend)
    throw CudaUnavailable("CUDA backend on device " + std::to_string(device) + ": " + error.str());
  return backend;
}

NcclId nccl_unique_id() {
  NcclId id{};
  ErrorText error;
  if (library().nccl_unique_id(id.data(), id.size(), error.data(), error.size()) != 0) {
    throw CudaUnavailable("nccl unique id: " + error.str());
  }
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, const NcclId& id, int rank,
                                                     int size, double timeout_s) {
  ErrorText error;
  std::unique_ptr<Communicator> comm(library().nccl_create(
      &backend, id.data(), id.size(), rank, size, timeout_s, error.data(), error.size()));
  if (!comm)
    throw CommError("nccl communicator (rank " + std::to_string(rank) + " of " +
                    std::to_string(size) + "): " + error.str());
  return comm;
}

}  // namespace pstrain::cuda
