#pragma once
// The on-disk format of parameter snapshots: a list of chunk records, each
// with its values, optimizer state and version. The ps writes one file per
// server (run_dir/snapshot/ps<N>.bin); the same format serves any later
// consumer that saves or loads parameters.
//
// Layout (little-endian):
//   "PSTRSNAP" | u32 format version | u64 global samples | u64 record count
//   per record: u32 name length | name | u32 chunk | u64 version
//               | u64 value count | u64 state count | f32 values | f32 state
//               | u32 crc32 (zlib) of the record's bytes before it
//
// Writes are atomic: a temporary file beside the target is written, fsynced
// and renamed over it, then the directory is fsynced, so a crash leaves either
// the old snapshot or the new one, never a mix.
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace pstrain {

inline constexpr std::uint32_t kSnapshotFormatVersion = 1;

struct SnapshotRecord {
  std::string name;   // variable name
  std::uint32_t chunk = 0;
  std::uint64_t version = 0;
  std::vector<float> values;
  std::vector<float> state;  // optimizer state, slot-major (shared/optimizer.h)
};

struct Snapshot {
  std::uint64_t global_samples = 0;
  std::vector<SnapshotRecord> records;
};

// A missing, truncated or corrupt file; the message names the file and what
// is wrong with it.
struct SnapshotError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void write_snapshot(const std::filesystem::path& path, const Snapshot& snapshot);
Snapshot read_snapshot(const std::filesystem::path& path);

}  // namespace pstrain
