#include "shared/snapshot.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <span>

#include "shared/atomic_file.h"

namespace pstrain {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'T', 'R', 'S', 'N', 'A', 'P'};

std::string errno_text() { return std::strerror(errno); }

// Writes fields and keeps the running crc of the current record.
class RecordWriter {
 public:
  explicit RecordWriter(AtomicFileWriter& file) : file_(file) {}
  void bytes(const void* data, std::size_t size) {
    // An empty vector's data() may be null, which zlib reads as "restart".
    if (size == 0) return;
    file_.write(data, size);
    crc_ = crc32_z(crc_, static_cast<const Bytef*>(data), size);
  }
  template <class T>
  void scalar(T value) {
    bytes(&value, sizeof(value));
  }
  void floats(std::span<const float> v) { bytes(v.data(), v.size_bytes()); }
  void begin_record() { crc_ = crc32_z(0, nullptr, 0); }
  void end_record() {
    const auto crc = static_cast<std::uint32_t>(crc_);
    file_.write(&crc, sizeof(crc));
  }

 private:
  AtomicFileWriter& file_;
  uLong crc_ = 0;
};

// Reads fields from the whole file held in memory, checking every length
// against the bytes that remain.
class Reader {
 public:
  Reader(const std::filesystem::path& path, std::vector<char> data)
      : path_(path), data_(std::move(data)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw SnapshotError("snapshot " + path_.string() + ": " + what);
  }
  std::span<const char> take(std::size_t size, const char* what) {
    if (size > data_.size() - pos_)
      fail("truncated: " + std::string(what) + " needs " + std::to_string(size) +
           " bytes at offset " + std::to_string(pos_) + ", the file has " +
           std::to_string(data_.size() - pos_) + " left");
    std::span<const char> s(data_.data() + pos_, size);
    pos_ += size;
    return s;
  }
  template <class T>
  T scalar(const char* what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what).data(), sizeof(T));
    return value;
  }
  std::vector<float> floats(std::uint64_t count, const char* what) {
    if (count > (data_.size() - pos_) / sizeof(float))
      fail("truncated: " + std::string(what) + " declares " + std::to_string(count) +
           " floats, more than the file holds");
    const auto bytes = take(count * sizeof(float), what);
    std::vector<float> v(count);
    // An empty vector's data() may be null, which memcpy must not get.
    if (count) std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
  std::size_t pos() const { return pos_; }
  bool at_end() const { return pos_ == data_.size(); }
  std::uint32_t crc_of(std::size_t from, std::size_t to) const {
    return static_cast<std::uint32_t>(crc32_z(
        crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(data_.data() + from), to - from));
  }

 private:
  std::filesystem::path path_;
  std::vector<char> data_;
  std::size_t pos_ = 0;
};

// The header of format 2, after the format version.
void read_info(Reader& r, SnapshotInfo& info) {
  const auto start = r.pos();
  const auto kind = r.scalar<std::uint32_t>("kind");
  if (kind > static_cast<std::uint32_t>(SnapshotKind::checkpoint))
    r.fail("unknown kind " + std::to_string(kind));
  info.kind = static_cast<SnapshotKind>(kind);
  info.config_hash = r.scalar<std::uint64_t>("config hash");
  const auto name = r.take(r.scalar<std::uint32_t>("optimizer name length"), "optimizer name");
  info.optimizer.assign(name.data(), name.size());
  info.global_samples = r.scalar<std::uint64_t>("global samples");
  const auto workers = r.scalar<std::uint32_t>("worker count");
  for (std::uint32_t w = 0; w < workers; ++w)
    info.worker_samples.push_back(r.scalar<std::uint64_t>("worker samples"));
  for (std::uint32_t w = 0; w < workers; ++w)
    info.worker_incarnations.push_back(r.scalar<std::uint64_t>("worker incarnation"));
  for (std::uint32_t w = 0; w < workers; ++w)
    info.worker_updates.push_back(r.scalar<std::uint64_t>("worker updates"));
  const auto expected = r.crc_of(start, r.pos());
  if (r.scalar<std::uint32_t>("crc") != expected) r.fail("crc mismatch in the header");
}

}  // namespace

void write_snapshot(const std::filesystem::path& path, const SnapshotInfo& info,
                    std::span<const SnapshotRecordView> records) {
  try {
    write_file_atomically(path, [&](AtomicFileWriter& file) {
      file.write(kMagic, sizeof(kMagic));
      const std::uint32_t format = kSnapshotFormatVersion;
      file.write(&format, sizeof(format));
      RecordWriter w(file);
      w.begin_record();
      w.scalar(static_cast<std::uint32_t>(info.kind));
      w.scalar(info.config_hash);
      w.scalar(static_cast<std::uint32_t>(info.optimizer.size()));
      w.bytes(info.optimizer.data(), info.optimizer.size());
      w.scalar(info.global_samples);
      w.scalar(static_cast<std::uint32_t>(info.worker_samples.size()));
      const auto workers = info.worker_samples.size();
      w.bytes(info.worker_samples.data(), workers * sizeof(std::uint64_t));
      // Parallel to worker_samples; missing entries are written as 0.
      for (const auto* per_worker : {&info.worker_incarnations, &info.worker_updates})
        for (std::size_t i = 0; i < workers; ++i)
          w.scalar(i < per_worker->size() ? (*per_worker)[i] : std::uint64_t{0});
      w.end_record();
      const std::uint64_t count = records.size();
      file.write(&count, sizeof(count));
      for (const auto& r : records) {
        w.begin_record();
        w.scalar(static_cast<std::uint32_t>(r.name.size()));
        w.bytes(r.name.data(), r.name.size());
        w.scalar(r.chunk);
        w.scalar(r.version);
        w.scalar(static_cast<std::uint64_t>(r.values.size()));
        w.scalar(static_cast<std::uint64_t>(r.state.size()));
        w.floats(r.values);
        w.floats(r.state);
        w.end_record();
      }
    });
  } catch (const SnapshotError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw SnapshotError(std::string("snapshot: ") + e.what());
  }
}

void write_snapshot(const std::filesystem::path& path, const Snapshot& snapshot) {
  std::vector<SnapshotRecordView> views;
  views.reserve(snapshot.records.size());
  for (const auto& r : snapshot.records)
    views.push_back({r.name, r.chunk, r.version, r.values, r.state});
  write_snapshot(path, snapshot, views);
}

Snapshot read_snapshot(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw SnapshotError("snapshot: cannot open " + path.string() + " (" + errno_text() + ")");
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Reader r(path, std::move(data));

  const auto magic = r.take(sizeof(kMagic), "magic");
  if (std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0)
    r.fail("not a pstrain snapshot (bad magic)");
  const auto format = r.scalar<std::uint32_t>("format version");
  Snapshot s;
  if (format == 1) {
    s.global_samples = r.scalar<std::uint64_t>("global samples");
  } else if (format == kSnapshotFormatVersion) {
    read_info(r, s);
  } else {
    r.fail("format version " + std::to_string(format) + ", this build reads 1 and " +
           std::to_string(kSnapshotFormatVersion));
  }
  const auto count = r.scalar<std::uint64_t>("record count");
  for (std::uint64_t i = 0; i < count; ++i) {
    const auto start = r.pos();
    SnapshotRecord rec;
    const auto name_len = r.scalar<std::uint32_t>("name length");
    const auto name = r.take(name_len, "name");
    rec.name.assign(name.data(), name.size());
    rec.chunk = r.scalar<std::uint32_t>("chunk");
    rec.version = r.scalar<std::uint64_t>("version");
    const auto n_values = r.scalar<std::uint64_t>("value count");
    const auto n_state = r.scalar<std::uint64_t>("state count");
    rec.values = r.floats(n_values, "values");
    rec.state = r.floats(n_state, "state");
    const auto expected = r.crc_of(start, r.pos());
    if (r.scalar<std::uint32_t>("crc") != expected)
      r.fail("crc mismatch in record " + std::to_string(i) + " ('" + rec.name + "' chunk " +
             std::to_string(rec.chunk) + ")");
    s.records.push_back(std::move(rec));
  }
  if (!r.at_end()) r.fail("unexpected bytes after the last record");
  return s;
}

}  // namespace pstrain
