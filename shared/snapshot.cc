#include "shared/snapshot.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
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
  template <class T>
  void array(std::span<const T> v) {
    bytes(v.data(), v.size_bytes());
  }
  void text(std::string_view s) {
    scalar(static_cast<std::uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
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
  template <class T>
  std::vector<T> array(std::uint64_t count, const char* what) {
    if (count > (data_.size() - pos_) / sizeof(T))
      fail("truncated: " + std::string(what) + " declares " + std::to_string(count) +
           " entries, more than the file holds");
    const auto bytes = take(count * sizeof(T), what);
    std::vector<T> v(count);
    // An empty vector's data() may be null, which memcpy must not get.
    if (count) std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
  std::vector<float> floats(std::uint64_t count, const char* what) {
    return array<float>(count, what);
  }
  std::string text(const char* what) {
    const auto s = take(scalar<std::uint32_t>(what), what);
    return {s.data(), s.size()};
  }
  // Reads a u32 crc and fails naming `what` unless it is the crc of the
  // bytes from `start` to here.
  void check_crc(std::size_t start, const std::string& what) {
    const auto expected = crc_of(start, pos_);
    if (scalar<std::uint32_t>("crc") != expected) fail("crc mismatch in " + what);
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

// The header of formats 2 and 3, after the format version.
void read_info(Reader& r, std::uint32_t format, SnapshotInfo& info) {
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
  if (format >= 3) info.previous = r.scalar<std::uint64_t>("previous generation");
  const auto expected = r.crc_of(start, r.pos());
  if (r.scalar<std::uint32_t>("crc") != expected) r.fail("crc mismatch in the header");
}

void write_table(RecordWriter& w, const TableSnapshotView& table) {
  const auto& h = table.header;
  w.begin_record();
  w.text(h.name);
  w.text(h.optimizer);
  w.scalar(h.dim);
  w.scalar(h.state_floats);
  w.scalar(h.clock);
  w.end_record();
  const auto block = [&](const TableRows& rows) {
    const std::uint64_t n = rows.keys.size();
    if (rows.clocks.size() != n || rows.seconds.size() != n ||
        rows.floats.size() != n * h.row_floats())
      throw std::logic_error("write_snapshot: a block of table '" + h.name + "' is ragged");
    if (n == 0) return;  // the empty block ends the table
    w.begin_record();
    w.scalar(n);
    w.array(std::span(rows.keys));
    w.array(std::span(rows.clocks));
    w.array(std::span(rows.seconds));
    w.array(std::span(rows.floats));
    w.end_record();
  };
  if (table.rows) table.rows(block);
  w.begin_record();
  w.scalar(std::uint64_t{0});
  w.end_record();
  w.begin_record();
  w.scalar(static_cast<std::uint64_t>(table.removed.size()));
  w.array(table.removed);
  w.end_record();
}

TableSnapshot read_table(Reader& r, std::uint64_t index) {
  TableSnapshot t;
  auto start = r.pos();
  t.name = r.text("table name");
  t.optimizer = r.text("row optimizer name");
  t.dim = r.scalar<std::uint32_t>("row width");
  t.state_floats = r.scalar<std::uint32_t>("row state floats");
  t.clock = r.scalar<std::uint64_t>("table clock");
  const std::string what = "table " + std::to_string(index) + " ('" + t.name + "')";
  r.check_crc(start, "the header of " + what);
  if (t.row_floats() == 0) r.fail(what + " has rows of no floats");
  for (std::uint64_t block = 0;; ++block) {
    start = r.pos();
    const auto n = r.scalar<std::uint64_t>("rows in a block");
    if (n > 0) {
      const auto append = [](auto& to, auto from) {
        to.insert(to.end(), from.begin(), from.end());
      };
      append(t.rows.keys, r.array<std::uint64_t>(n, "row keys"));
      append(t.rows.clocks, r.array<std::uint64_t>(n, "row clocks"));
      append(t.rows.seconds, r.array<std::uint32_t>(n, "row seconds"));
      if (n > std::numeric_limits<std::uint64_t>::max() / t.row_floats())
        r.fail(what + " declares " + std::to_string(n) + " rows, more than the file holds");
      append(t.rows.floats, r.floats(n * t.row_floats(), "row values"));
    }
    r.check_crc(start, "block " + std::to_string(block) + " of " + what);
    if (n == 0) break;
  }
  start = r.pos();
  t.removed = r.array<std::uint64_t>(r.scalar<std::uint64_t>("removed rows"), "removed keys");
  r.check_crc(start, "the removed rows of " + what);
  return t;
}

}  // namespace

void write_snapshot(const std::filesystem::path& path, const SnapshotInfo& info,
                    std::span<const SnapshotRecordView> records,
                    std::span<const TableSnapshotView> tables) {
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
      w.scalar(info.previous);
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
        w.array(r.values);
        w.array(r.state);
        w.end_record();
      }
      const std::uint64_t table_count = tables.size();
      file.write(&table_count, sizeof(table_count));
      for (const auto& t : tables) write_table(w, t);
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
  std::vector<TableSnapshotView> tables;
  for (const auto& t : snapshot.tables)
    tables.push_back({t, [&t](const auto& emit) { emit(t.rows); }, t.removed});
  write_snapshot(path, snapshot, views, tables);
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
  } else if (format == 2 || format == kSnapshotFormatVersion) {
    read_info(r, format, s);
  } else {
    r.fail("format version " + std::to_string(format) + ", this build reads 1 to " +
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
  if (format >= 3) {
    const auto tables = r.scalar<std::uint64_t>("table count");
    for (std::uint64_t i = 0; i < tables; ++i) s.tables.push_back(read_table(r, i));
  }
  if (!r.at_end()) r.fail("unexpected bytes after the last record");
  return s;
}

}  // namespace pstrain
