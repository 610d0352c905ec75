#pragma once
// The on-disk format of parameter snapshots: who wrote the file (a snapshot
// or a checkpoint, the run's config hash, the optimizer, training progress),
// a list of chunk records, each with its values, optimizer state and
// version, and the rows of the ps's embedding tables (docs/embeddings.md). The ps writes one file
// per server (run_dir/snapshot/ps<N>.bin, run_dir/checkpoints/ckpt-<seq>/ps<N>.bin); worker 0
// writes the model in it.
//
// Layout (little-endian), format 3:
//   "PSTRSNAP" | u32 format version
//   | u32 kind | u64 config hash | u32 optimizer name length | name
//   | u64 global samples | u32 workers | u64 samples per worker
//   | u64 incarnation per worker | u64 updates per worker
//   | u64 previous (a delta checkpoint's base generation; 0: whole)
//   | u32 crc32 (zlib) of the header's bytes after the format version
//   | u64 record count
//   per record: u32 name length | name | u32 chunk | u64 version
//               | u64 value count | u64 state count | f32 values | f32 state
//               | u32 crc32 of the record's bytes before it
//   | u64 table count
//   per table: u32 name length | name | u32 optimizer name length | name
//              | u32 dim | u32 state floats | u64 update clock | u32 crc32
//              then blocks of rows, the last one empty: u64 rows
//              | u64 key per row | u64 clock per row | u32 second per row
//              | f32 (dim + state) per row | u32 crc32 of the block
//              then u64 removed count | u64 keys | u32 crc32
// Format 2 lacked `previous` and the tables; format 1 (before checkpoints)
// had only the global samples between the format version and the record
// count. Both are still read, format 1 as a snapshot of unknown run and
// optimizer.
//
// Writes are atomic: a temporary file beside the target is written, fsynced
// and renamed over it, then the directory is fsynced, so a crash leaves either
// the old snapshot or the new one, never a mix.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "shared/error.h"

namespace pstrain {

inline constexpr std::uint32_t kSnapshotFormatVersion = 3;

// A snapshot may seed another run (another config); a checkpoint resumes its
// own run only, so a restore checks its config hash.
enum class SnapshotKind : std::uint32_t { snapshot = 0, checkpoint = 1 };

struct SnapshotRecord {
  std::string name;  // variable name
  std::uint32_t chunk = 0;
  std::uint64_t version = 0;
  std::vector<float> values;
  std::vector<float> state;  // optimizer state, slot-major (shared/optimizer.h)
};

// The same record as views, so that a writer can save buffers it shares
// with a running ps (a checkpoint) without copying them.
struct SnapshotRecordView {
  std::string_view name;
  std::uint32_t chunk = 0;
  std::uint64_t version = 0;
  std::span<const float> values;
  std::span<const float> state;
};

struct SnapshotInfo {
  SnapshotKind kind = SnapshotKind::snapshot;
  std::uint64_t config_hash = 0;  // of the writing run; 0: unknown (format 1, model files)
  std::string optimizer;          // the optimizer's name; "": unknown
  std::uint64_t global_samples = 0;
  std::vector<std::uint64_t> worker_samples;  // samples trained, per worker index
  // Per worker, as many entries as worker_samples: the incarnation (process
  // start) whose updates `worker_updates` counts, and how many chunk updates
  // (pushes, assigns) of it this ps had applied. A worker that reconnects to
  // a restored ps says how many it had acknowledged; the difference is what
  // the restore lost (server/coordinator.h).
  std::vector<std::uint64_t> worker_incarnations;
  std::vector<std::uint64_t> worker_updates;
  // A delta checkpoint (checkpoint.incremental): the generation whose state
  // it continues, which holds the table rows it does not repeat; 0: the
  // file is whole.
  std::uint64_t previous = 0;
};

// Rows of an embedding table, column by column: per row its key, the
// table's update clock and the UNIX second of its last update, and its
// values followed by its optimizer state (row_floats each).
struct TableRows {
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> clocks;
  std::vector<std::uint32_t> seconds;
  std::vector<float> floats;
};

struct TableHeader {
  std::string name;
  std::string optimizer;  // the row optimizer's name; its state must fit
  std::uint32_t dim = 0;
  std::uint32_t state_floats = 0;
  std::uint64_t clock = 0;  // the table's update clock when it was cut
  std::size_t row_floats() const { return std::size_t{dim} + state_floats; }
};

// One table as read back. In a delta, `rows` are the rows updated since the
// previous generation and `removed` the keys dropped (evicted, expired)
// since then; a whole file has every row and nothing removed.
struct TableSnapshot : TableHeader {
  TableRows rows;
  std::vector<std::uint64_t> removed;
};

// One table as written: `rows` calls its argument with the rows, a block at
// a time, so that a writer need not hold the table's copy at once.
struct TableSnapshotView {
  TableHeader header;
  std::function<void(const std::function<void(const TableRows&)>&)> rows;
  std::span<const std::uint64_t> removed;
};

struct Snapshot : SnapshotInfo {
  std::vector<SnapshotRecord> records;
  std::vector<TableSnapshot> tables;
};

// A missing, truncated or corrupt file; the message names the file and what
// is wrong with it.
struct SnapshotError : pstrain::Error {
  using pstrain::Error::Error;
};

void write_snapshot(const std::filesystem::path& path, const Snapshot& snapshot);
void write_snapshot(const std::filesystem::path& path, const SnapshotInfo& info,
                    std::span<const SnapshotRecordView> records,
                    std::span<const TableSnapshotView> tables = {});
Snapshot read_snapshot(const std::filesystem::path& path);

}  // namespace pstrain
