#pragma once
// One ps's shard on disk: the cut that a snapshot or a checkpoint writes,
// where checkpoint generations live, and reading a shard back when a ps
// starts (--restore).
//
// Checkpoints live in <run_dir>/checkpoints/ckpt-<seq>/ps<N>.bin, or
// ps<N>.delta.bin for a delta (checkpoint.incremental: the table rows
// updated since this ps's previous generation, every chunk whole). Every ps
// writes its own files atomically (shared/atomic_file.h) on its own clock, so
// the servers' files of one generation are not one cut of the whole model.
// `--restore latest` therefore takes THIS ps's newest readable file, not the
// newest generation every ps has: a single restarted ps loses only what it
// applied since its last checkpoint, and the others keep everything.
//
// Thread rules: cut_shard() runs on the ps thread (it reads the stores and the
// coordinator); write_shard() reads only the cut, whose buffers nobody writes
// while it holds them (server/chunk_store.h, server/table_store.h), so it may
// run on any thread.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/table_store.h"
#include "shared/snapshot.h"

namespace pstrain::ps {

// The parts of a ps that its files hold.
struct Shard {
  const ChunkStore& store;
  TableStore& tables;
  const Coordinator& coordinator;
  std::uint64_t config_hash = 0;
};

// The shard between two requests: the store's chunks by reference, the
// tables' rows as of the cut (TableCut) and the coordinator's progress.
// O(chunks + table segments); no value or state is copied.
struct ShardCut {
  SnapshotInfo info;
  std::vector<HeldChunk> chunks;
  TableCut tables;
};

// `kind` says what the tables' part holds (server/table_store.h); a delta
// continues generation `previous`.
ShardCut cut_shard(const Shard& shard, CutKind kind, std::uint64_t previous = 0);
// Throws SnapshotError.
void write_shard(const std::filesystem::path& file, const ShardCut& cut);

std::filesystem::path shard_file(const std::filesystem::path& dir, std::uint32_t ps_index);
std::filesystem::path delta_file(const std::filesystem::path& dir, std::uint32_t ps_index);
std::filesystem::path checkpoints_dir(const std::filesystem::path& run_dir);
std::filesystem::path generation_dir(const std::filesystem::path& checkpoints, std::uint64_t seq);
// The sequence numbers of the generation folders in `checkpoints`, ascending.
std::vector<std::uint64_t> generations(const std::filesystem::path& checkpoints);

// What a ps started from.
struct RestoredShard {
  std::filesystem::path file;
  SnapshotInfo info;                 // what the file says of itself, progress included
  std::uint64_t checkpoint_seq = 0;  // the generation restored; 0: not a checkpoint
};

// `--restore DIR`: loads ps `ps_index`'s file from `dir` (an end-of-run
// snapshot folder, or one checkpoint generation ckpt-<seq>, with the
// generations before it that a delta continues) into `store` and `tables`.
// Throws SnapshotError naming the file when it is missing or damaged, or does
// not fit this run: written with another optimizer, or a checkpoint of
// another run or configuration (config hash; an end-of-run snapshot may seed
// a new run, so its hash is not compared). For a snapshot, also when the folder holds
// the files of another number of servers than `servers` (the shard map
// depends on it; a checkpoint's config hash already covers the ps list).
RestoredShard restore_shard(ChunkStore& store, TableStore& tables, const std::filesystem::path& dir,
                            std::uint32_t ps_index, std::size_t servers, std::uint64_t config_hash);

// `--restore latest`: loads this ps's newest checkpoint in `checkpoints`.
// A file that cannot be read (damaged, truncated), or a delta whose chain
// back to a whole file has such a file or a gap, is logged by name and the
// next older generation is tried. Returns nullopt, logging that the ps starts
// fresh, when this ps has no readable checkpoint. Throws SnapshotError when
// the newest readable file does not fit: written with another optimizer or
// by another run or configuration (config hash); resuming from it would mix
// runs, so that is refused rather than skipped.
std::optional<RestoredShard> restore_latest(ChunkStore& store, TableStore& tables,
                                            const std::filesystem::path& checkpoints,
                                            std::uint32_t ps_index, std::uint64_t config_hash);

}  // namespace pstrain::ps
