#include "client/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

namespace pstrain {
namespace {

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

std::string hex32(std::uint32_t value) {
  char text[11];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

class Reader {
 public:
  explicit Reader(const std::filesystem::path& path) : path_(path) {
    errno = 0;
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) {
      throw DataError("cannot open " + path_.string() + " (" +
                      (errno ? std::strerror(errno) : "out of memory") + ")");
    }
    // The default 8 KiB buffer makes inflate noticeably slower on the 26 MB
    // training images.
    gzbuffer(file_.get(), 1 << 18);
  }

  // Reads up to `bytes` bytes; returns how many were there.
  std::size_t read(void* out, std::size_t bytes) {
    auto* dst = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < bytes) {
      const unsigned ask = static_cast<unsigned>(std::min<std::size_t>(bytes - done, 1u << 30));
      const int got = gzread(file_.get(), dst + done, ask);
      if (got < 0) fail(std::string("corrupt gzip data (") + zlib_error() + ")");
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  void read_exactly(void* out, std::size_t bytes, const std::string& what) {
    const std::size_t got = read(out, bytes);
    if (got != bytes) {
      fail("truncated: " + what + " needs " + std::to_string(bytes) + " bytes, the file holds " +
           std::to_string(got));
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(path_.string() + ": " + what);
  }

 private:
  const char* zlib_error() const {
    int code = Z_OK;
    const char* text = gzerror(file_.get(), &code);
    return code == Z_ERRNO ? std::strerror(errno) : text;
  }

  std::filesystem::path path_;
  GzFile file_;
};

std::uint32_t big_endian(const unsigned char* bytes) {
  return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
         (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
}

}  // namespace

IdxArray read_idx(const std::filesystem::path& path, int rank) {
  Reader reader(path);
  unsigned char magic[4];
  reader.read_exactly(magic, sizeof magic, "the magic number");
  const std::uint32_t expected = 0x00000800u | static_cast<std::uint32_t>(rank);
  if (big_endian(magic) != expected) {
    reader.fail("bad magic number " + hex32(big_endian(magic)) + ", expected " + hex32(expected) +
                " (unsigned bytes, " + std::to_string(rank) + " dimensions)");
  }

  IdxArray array;
  std::vector<unsigned char> header(4 * static_cast<std::size_t>(rank));
  reader.read_exactly(header.data(), header.size(), "the dimensions");
  std::uint64_t total = 1;
  for (int d = 0; d < rank; ++d) {
    const std::uint32_t dim = big_endian(&header[4 * static_cast<std::size_t>(d)]);
    if (dim == 0) reader.fail("dimension " + std::to_string(d) + " is zero");
    total *= dim;
    // Far above any real dataset: a corrupted header must not make us
    // allocate terabytes.
    if (total > (std::uint64_t{1} << 34)) {
      reader.fail("dimensions declare more than 16 GiB of values");
    }
    array.dims.push_back(dim);
  }

  array.values.resize(total);
  std::string shape;
  for (std::uint32_t dim : array.dims) {
    shape += (shape.empty() ? "" : "x") + std::to_string(dim);
  }
  reader.read_exactly(array.values.data(), array.values.size(),
                      "the declared " + shape + " values");
  unsigned char extra;
  if (reader.read(&extra, 1) != 0) {
    reader.fail("trailing bytes after the declared " + shape + " values");
  }
  return array;
}

}  // namespace pstrain
