#include "shared/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pstrain {
namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path) {
  throw std::runtime_error(what + " " + path.string() + " (" + std::strerror(errno) + ")");
}

// A file descriptor that closes itself.
class File final : public AtomicFileWriter {
 public:
  File(const std::filesystem::path& path, int flags) : path_(path) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot open", path);
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void write(const void* data, std::size_t size) override {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("writing", path_);
      p += n;
      size -= static_cast<std::size_t>(n);
    }
  }
  void sync() {
    if (::fsync(fd_) != 0) fail("fsync of", path_);
  }
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing", path_);
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace

void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(AtomicFileWriter&)>& fill) {
  const auto dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir.string() + " (" + ec.message() + ")");
  auto tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  try {
    {
      File file(tmp, O_WRONLY | O_CREAT | O_TRUNC);
      fill(file);
      file.sync();
      file.close();
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec)
      throw std::runtime_error("renaming " + tmp.string() + " to " + path.string() + " failed (" +
                               ec.message() + ")");
  } catch (...) {
    // A failed write leaves the target as it was and nothing beside it.
    std::filesystem::remove(tmp, ec);
    throw;
  }
  File(dir, O_RDONLY | O_DIRECTORY).sync();
}

void write_file_atomically(const std::filesystem::path& path, std::string_view content) {
  write_file_atomically(path,
                        [&](AtomicFileWriter& f) { f.write(content.data(), content.size()); });
}

}  // namespace pstrain
