// CPU-side checks of libpstrain_cuda.so, which run without a GPU: the build
// produced it, it carries code for every configured architecture, it depends
// on CUDA libraries only, and the loader reaches NCCL through it.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <elf.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "client/compute/cuda_loader.h"

namespace {

#if defined(PSTRAIN_CUDA_LIBRARY)

std::vector<char> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class T>
T read_at(const std::vector<char>& bytes, std::size_t offset) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

struct Section {
  std::size_t offset = 0, size = 0;
};

Section find_section(const std::vector<char>& elf, const std::string& name) {
  const auto header = read_at<Elf64_Ehdr>(elf, 0);
  REQUIRE(std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0);
  const auto names =
      read_at<Elf64_Shdr>(elf, header.e_shoff + header.e_shstrndx * sizeof(Elf64_Shdr));
  for (int i = 0; i < header.e_shnum; ++i) {
    const auto s = read_at<Elf64_Shdr>(elf, header.e_shoff + i * sizeof(Elf64_Shdr));
    if (name == elf.data() + names.sh_offset + s.sh_name) return {s.sh_offset, s.sh_size};
  }
  return {};
}

// The fatbin section holds containers (magic 0xBA55ED50) of entries, each a
// cubin for one sm_XX (kind 2) or PTX for one compute_XX (kind 1), with the
// architecture at byte 28 of the entry header: what `cuobjdump --list-elf`
// and `--list-ptx` print, read without needing cuobjdump installed.
std::set<std::string> fatbin_entries(const std::vector<char>& elf) {
  const Section fatbin = find_section(elf, ".nv_fatbin");
  REQUIRE_MESSAGE(fatbin.size > 0, "the library has no .nv_fatbin section");
  std::set<std::string> entries;
  std::size_t at = fatbin.offset;
  const std::size_t end = fatbin.offset + fatbin.size;
  while (at + 16 <= end) {
    if (read_at<std::uint32_t>(elf, at) != 0xBA55ED50u) {
      at += 8;  // containers are 8-byte aligned, separated by padding
      continue;
    }
    const auto header_size = read_at<std::uint16_t>(elf, at + 6);
    const auto fat_size = read_at<std::uint64_t>(elf, at + 8);
    std::size_t entry = at + header_size;
    const std::size_t container_end = entry + fat_size;
    REQUIRE(container_end <= end);
    while (entry < container_end) {
      const auto kind = read_at<std::uint16_t>(elf, entry);
      const auto entry_header = read_at<std::uint32_t>(elf, entry + 4);
      const auto payload = read_at<std::uint64_t>(elf, entry + 8);
      const auto arch = read_at<std::uint32_t>(elf, entry + 28);
      REQUIRE((kind == 1 || kind == 2));
      entries.insert((kind == 2 ? "sm_" : "compute_") + std::to_string(arch));
      entry += entry_header + payload;
    }
    at = container_end;
  }
  return entries;
}

std::vector<std::string> needed_libraries(const std::vector<char>& elf) {
  const Section dynamic = find_section(elf, ".dynamic");
  const Section strings = find_section(elf, ".dynstr");
  REQUIRE(dynamic.size > 0);
  std::vector<std::string> needed;
  for (std::size_t at = dynamic.offset; at < dynamic.offset + dynamic.size;
       at += sizeof(Elf64_Dyn)) {
    const auto d = read_at<Elf64_Dyn>(elf, at);
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag == DT_NEEDED) needed.emplace_back(elf.data() + strings.offset + d.d_un.d_val);
  }
  return needed;
}

// PSTRAIN_CUDA_ARCHITECTURES, one entry each: "90-real" is {"90", "real"}.
struct Architecture {
  std::string number, suffix;  // suffix: "real", "virtual" or empty (both)
};
std::vector<Architecture> configured_architectures() {
  std::vector<Architecture> archs;
  std::stringstream list(PSTRAIN_CUDA_ARCHITECTURES_CSV);
  for (std::string arch; std::getline(list, arch, ',');) {
    const auto dash = arch.find('-');
    archs.push_back({arch.substr(0, dash), dash == std::string::npos ? "" : arch.substr(dash + 1)});
  }
  return archs;
}

// "75-real,80-real,90" -> sm_75, sm_80, sm_90, compute_90.
std::set<std::string> expected_entries() {
  std::set<std::string> expected;
  for (const auto& [number, suffix] : configured_architectures()) {
    if (suffix != "virtual") expected.insert("sm_" + number);
    if (suffix != "real") expected.insert("compute_" + number);
  }
  return expected;
}

void point_loader_at_library() { ::setenv("PSTRAIN_CUDA_LIB", PSTRAIN_CUDA_LIBRARY, 1); }

TEST_CASE("cuda library: built, with code for every configured architecture") {
  const auto elf = read_file(PSTRAIN_CUDA_LIBRARY);
  const auto entries = fatbin_entries(elf);
  for (const auto& want : expected_entries()) {
    CHECK_MESSAGE(entries.count(want) == 1, "no " << want << " code in " << PSTRAIN_CUDA_LIBRARY);
  }
  // The default build must run on Turing, Ampere and Hopper and JIT beyond.
  const std::string configured = PSTRAIN_CUDA_ARCHITECTURES_CSV;
  if (configured == "75-real,80-real,90") {
    CHECK(entries == std::set<std::string>{"sm_75", "sm_80", "sm_90", "compute_90"});
  }
}

TEST_CASE("cuda library: links CUDA libraries only") {
  const auto needed = needed_libraries(read_file(PSTRAIN_CUDA_LIBRARY));
  CHECK(!needed.empty());
  for (const auto& lib : needed) {
    for (const char* banned :
         {"libopenblas", "libblas", "libzmq", "libgloo", "libyaml", "libboost"}) {
      CHECK_MESSAGE(lib.find(banned) == std::string::npos, "libpstrain_cuda.so needs " << lib);
    }
  }
}

TEST_CASE("cuda loader: loads the library and reports its architectures") {
  point_loader_at_library();
  CHECK(pstrain::cuda::library_path() == PSTRAIN_CUDA_LIBRARY);
  // "75-real,80-real,90" is reported as "75;80;90+PTX".
  std::string want;
  for (const auto& [number, suffix] : configured_architectures()) {
    want += (want.empty() ? "" : ";") + number +
            (suffix == "real"      ? ""
             : suffix == "virtual" ? "(PTX only)"
                                   : "+PTX");
  }
  CHECK(pstrain::cuda::architectures() == want);
}

TEST_CASE("cuda loader: a library built from other interface headers is refused") {
  // The same ABI version number, another interface: what an older install
  // whose version bump was forgotten looks like.
  CHECK_THROWS_WITH_AS(pstrain::cuda::check_library(PSTRAIN_FAKE_CUDA_OTHER_HASH),
                       doctest::Contains("was built from other interface headers (hash "
                                         "0123456789abcdef"),
                       pstrain::cuda::CudaUnavailable);
  CHECK_THROWS_WITH_AS(pstrain::cuda::check_library(PSTRAIN_FAKE_CUDA_NO_HASH),
                       doctest::Contains("has no interface hash"), pstrain::cuda::CudaUnavailable);
  CHECK_NOTHROW(pstrain::cuda::check_library(PSTRAIN_CUDA_LIBRARY));
}

TEST_CASE("cuda loader: NCCL unique ids need no GPU") {
  point_loader_at_library();
  const auto a = pstrain::cuda::nccl_unique_id();
  const auto b = pstrain::cuda::nccl_unique_id();
  CHECK(a != pstrain::cuda::NcclId{});
  CHECK(a != b);  // each id carries a fresh random magic
}

// The number of devices as the NVIDIA driver itself counts them, or nullopt
// where no driver is installed: what the library's answer must agree with.
std::optional<int> driver_device_count() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) return std::nullopt;
  const auto init = reinterpret_cast<int (*)(unsigned)>(::dlsym(driver, "cuInit"));
  const auto count = reinterpret_cast<int (*)(int*)>(::dlsym(driver, "cuDeviceGetCount"));
  REQUIRE((init && count));
  constexpr int kNoDevice = 100;  // CUDA_ERROR_NO_DEVICE
  const int status = init(0);
  if (status == kNoDevice) return 0;
  REQUIRE(status == 0);
  int devices = 0;
  REQUIRE(count(&devices) == 0);
  return devices;
}

TEST_CASE("cuda loader: the device count is the driver's, or names why there is none") {
  point_loader_at_library();
  const auto driver = driver_device_count();
  if (!driver) {
    CHECK_THROWS_WITH_AS(pstrain::cuda::device_count(),
                         "no CUDA device: cudaGetDeviceCount failed: CUDA driver version is "
                         "insufficient for CUDA runtime version (cudaErrorInsufficientDriver)",
                         pstrain::cuda::CudaUnavailable);
  } else if (*driver == 0) {
    CHECK_THROWS_WITH_AS(pstrain::cuda::device_count(), doctest::Contains("(cudaErrorNoDevice)"),
                         pstrain::cuda::CudaUnavailable);
  } else {
    CHECK(pstrain::cuda::device_count() == *driver);
  }
}

#else

TEST_CASE("cuda loader: a build without CUDA says so") {
  ::unsetenv("PSTRAIN_CUDA_LIB");
  try {
    pstrain::cuda::make_cuda_backend(0);
    FAIL("a CUDA backend appeared in a build without CUDA");
  } catch (const pstrain::cuda::CudaUnavailable& e) {
    CHECK(std::string(e.what()).find("built without CUDA") != std::string::npos);
  }
}

#endif

}  // namespace
