#pragma once
// The on-disk format of parameter snapshots: who wrote the file (a snapshot
// or a checkpoint, the run's config hash, the optimizer, training progress)
// and a list of chunk records, each with its values, optimizer state and
// version. The ps writes one file per server (run_dir/snapshot/ps<N>.bin,
// run_dir/checkpoints/ckpt-<seq>/ps<N>.bin); worker 0 writes the model in it.
//
// Layout (little-endian), format 2:
//   "PSTRSNAP" | u32 format version
//   | u32 kind | u64 config hash | u32 optimizer name length | name
//   | u64 global samples | u32 workers | u64 samples per worker
//   | u64 incarnation per worker | u64 updates per worker
//   | u32 crc32 (zlib) of the header's bytes after the format version
//   | u64 record count
//   per record: u32 name length | name | u32 chunk | u64 version
//               | u64 value count | u64 state count | f32 values | f32 state
//               | u32 crc32 of the record's bytes before it
// Format 1 (before checkpoints) had only the global samples between the
// format version and the record count; it is still read, as a snapshot of
// unknown run and optimizer.
//
// Writes are atomic: a temporary file beside the target is written, fsynced
// and renamed over it, then the directory is fsynced, so a crash leaves either
// the old snapshot or the new one, never a mix.
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "shared/error.h"

namespace pstrain {

inline constexpr std::uint32_t kSnapshotFormatVersion = 2;

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
};

struct Snapshot : SnapshotInfo {
  std::vector<SnapshotRecord> records;
};

// A missing, truncated or corrupt file; the message names the file and what
// is wrong with it.
struct SnapshotError : pstrain::Error {
  using pstrain::Error::Error;
};

void write_snapshot(const std::filesystem::path& path, const Snapshot& snapshot);
void write_snapshot(const std::filesystem::path& path, const SnapshotInfo& info,
                    std::span<const SnapshotRecordView> records);
Snapshot read_snapshot(const std::filesystem::path& path);

}  // namespace pstrain
