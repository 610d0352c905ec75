#pragma once
// Periodic checkpoints of one ps's shard, written while the ps serves on.
//
// Every `every` the ps thread takes a cut of the shard (server/shard_file.h:
// references to the chunks' values and optimizer state, O(chunks)) and hands
// it to a writer thread, which serializes it, CRCs it and writes
// <run_dir>/checkpoints/ckpt-<seq>/ps<N>.bin atomically, then removes this
// ps's files of all but the newest `keep` generations (and a generation
// folder once it is empty). Updates that arrive meanwhile copy the chunk they
// touch first (copy-on-write in ChunkStore), so the file holds exactly the
// cut. finish() writes one more on the way out (signal, all workers done, a
// silent worker), so nothing the ps applied is lost when it exits.
//
// With `incremental`, a checkpoint after this process's first writes only
// the table rows updated since its previous one (a delta, ps<N>.delta.bin;
// server/shard_file.h), and every `full_every`-th is whole again, as is the
// one after a failed write. Pruning keeps what the newest `keep` need: back
// to the whole file the oldest of them continues.
//
// Sequence numbers continue after the highest generation already in the
// folder, so a restarted ps never overwrites a generation, and the servers of
// one run, started together, number theirs alike.
//
// The writer runs at a lower priority (nice 10) than the request loop, so
// on a busy host a checkpoint costs serving as little CPU as possible.
//
// Thread rules: tick(), finish() and the destructor run on the ps thread.
// At most one writer thread exists, so one checkpoint at a time; it touches
// only its cut (moved to it when it starts) and the files, and says it is
// done through `writing_`; what it wrote (`written_`) is read only after it
// is joined. The ps thread joins it before starting the next
// one, and before anything the cut came from goes away. Nothing else is
// shared, so there is no mutex (options.written must be safe to call from
// the writer's thread).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <thread>

#include "server/request.h"
#include "server/shard_file.h"

namespace pstrain::ps {

struct CheckpointerOptions {
  std::filesystem::path checkpoints;  // <run_dir>/checkpoints
  std::uint32_t ps_index = 0;
  std::chrono::duration<double> every{60};  // checkpoint.every_s, > 0
  std::uint32_t keep = 3;                   // checkpoint.keep, >= 1
  bool incremental = false;                 // checkpoint.incremental
  std::uint32_t full_every = 10;            // checkpoint.full_every, >= 1
  // Told the seconds each checkpoint took to write, on the writer's thread
  // (PsStats::checkpoint_written); none: not told.
  std::function<void(double seconds)> written = {};
};

class Checkpointer {
 public:
  // `cut` takes the shard's cut of a kind (checkpoint_whole or
  // checkpoint_delta, continuing generation `previous`); it is called on
  // the ps thread only. The first checkpoint is due `every` after `start`.
  using Cut = std::function<ShardCut(CutKind kind, std::uint64_t previous)>;
  Checkpointer(CheckpointerOptions options, Cut cut, Clock::time_point start);
  ~Checkpointer();  // waits for a write in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Starts a checkpoint when one is due and none is being written.
  void tick(Clock::time_point now);
  // Writes a last checkpoint, after the one in flight, and waits for both.
  void finish();

 private:
  void start();
  void join();
  // Returns whether the file was written.
  bool write(const std::filesystem::path& file, std::uint64_t seq, const ShardCut& cut) const;
  void prune() const;

  CheckpointerOptions options_;
  Cut cut_;
  std::uint64_t next_seq_;
  // The generation this process last wrote (0: none, or its write failed),
  // set by the writer, read after join(); and the deltas written since the
  // last whole file.
  std::uint64_t written_ = 0;
  std::uint32_t deltas_ = 0;
  Clock::time_point due_;
  std::thread writer_;
  std::atomic<bool> writing_{false};
};

}  // namespace pstrain::ps
