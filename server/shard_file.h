#pragma once
// One ps's shard on disk: the cut that a snapshot or a checkpoint writes,
// where checkpoint generations live, and reading a shard back when a ps
// starts (--restore).
//
// Checkpoints live in <run_dir>/checkpoints/ckpt-<seq>/ps<N>.bin. Every ps
// writes its own files atomically (shared/atomic_file.h) on its own clock, so
// the servers' files of one generation are not one cut of the whole model.
// `--restore latest` therefore takes THIS ps's newest readable file, not the
// newest generation every ps has: a single restarted ps loses only what it
// applied since its last checkpoint, and the others keep everything.
//
// Thread rules: cut_shard() runs on the ps thread (it reads the store and the
// coordinator); write_shard() reads only the cut, whose buffers nobody writes
// while it holds them (server/chunk_store.h), so it may run on any thread.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "shared/snapshot.h"

namespace pstrain::ps {

// The shard between two requests: the store's chunks by reference and the
// coordinator's progress. O(chunks); no value or state is copied.
struct ShardCut {
  SnapshotInfo info;
  std::vector<HeldChunk> chunks;
};

ShardCut cut_shard(const ChunkStore& store, const Coordinator& coordinator,
                   std::uint64_t config_hash, SnapshotKind kind);
// Throws SnapshotError.
void write_shard(const std::filesystem::path& file, const ShardCut& cut);

std::filesystem::path shard_file(const std::filesystem::path& dir, std::uint32_t ps_index);
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
// snapshot folder, or one checkpoint generation ckpt-<seq>) into `store`.
// Throws SnapshotError naming the file when it is missing or damaged, or does
// not fit this run: written with another optimizer, or a checkpoint of
// another run or configuration (config hash; an end-of-run snapshot may seed
// a new run, so its hash is not compared). For a snapshot, also when the folder holds
// the files of another number of servers than `servers` (the shard map
// depends on it; a checkpoint's config hash already covers the ps list).
RestoredShard restore_shard(ChunkStore& store, const std::filesystem::path& dir,
                            std::uint32_t ps_index, std::size_t servers, std::uint64_t config_hash);

// `--restore latest`: loads this ps's newest checkpoint in `checkpoints`.
// A file that cannot be read (damaged, truncated) is logged by name and the
// next older one is tried. Returns nullopt, logging that the ps starts
// fresh, when this ps has no readable checkpoint. Throws SnapshotError when
// the newest readable file does not fit: written with another optimizer or
// by another run or configuration (config hash); resuming from it would mix
// runs, so that is refused rather than skipped.
std::optional<RestoredShard> restore_latest(ChunkStore& store,
                                            const std::filesystem::path& checkpoints,
                                            std::uint32_t ps_index, std::uint64_t config_hash);

}  // namespace pstrain::ps
