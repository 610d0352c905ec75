#pragma once
// Files that are replaced whole: a reader, or a crash, sees the old content
// or the new, never a mix. The new content goes to a temporary file beside
// the target (named per process, so two processes may replace one file at
// once), is fsynced, renamed over the target, and the directory is fsynced.
// Failures throw std::runtime_error naming the file and the system's reason;
// the temporary file is removed then, and the target is left as it was.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string_view>

namespace pstrain {

// Unbuffered writes to the temporary file (the callers write a few large
// arrays or one small text).
class AtomicFileWriter {
 public:
  virtual void write(const void* data, std::size_t size) = 0;

 protected:
  ~AtomicFileWriter() = default;
};

// Creates the target's directory if needed, runs `fill` on the temporary
// file, then puts it in place.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(AtomicFileWriter&)>& fill);
void write_file_atomically(const std::filesystem::path& path, std::string_view content);

}  // namespace pstrain
