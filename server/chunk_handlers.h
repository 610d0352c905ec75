#pragma once
// The ps's ops on parameters, over its ChunkStore: init, pull, push,
// push_pull and assign of one chunk each, and snapshot, which writes every
// chunk (with the coordinator's progress) to run_dir/snapshot/ps<index>.bin
// (server/shard_file.h).
//
// A push, push_pull or assign carrying a NaN or an infinity is refused
// before anything is stored (one poisoned gradient would spoil the chunk for
// the rest of the run), counted in the stats and logged with its sender (the
// first from each sender; the count has the rest).
//
// Pulled values go out without a copy (ReplyPayload holds the chunk's
// buffer); incoming values and gradients are read in place from the frame.
// Under net.wire_dtype bf16 or fp16, gradients arrive in 16 bits and are
// widened, and values leave as a copy rounded to the request's dtype: the
// store, its optimizer state and snapshots stay f32 (shared/messages.h).
//
// Pushes and pulls, once decoded and checked, are answered as the mode's
// consistency policy says (server/consistency/policy.h): at once in async,
// or held until the slowest worker catches up (ssp) or a step has its
// gradients (backup); tick() lets the policy answer what the coordinator's
// news (a worker lost or finished) releases.
//
// A snapshot takes a cut of the shard (references to the chunks, which
// updates then copy on write) and a thread of its own writes it, so serving
// goes on however large the store; tick() replies once the file is written.
//
// Thread rules: single-threaded, like the whole ps (server/request.h), but
// for the snapshot writer, which touches only its cut and its own result
// until it sets `done`; the ps thread reads the result after that, or after
// joining it.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "server/chunk_store.h"
#include "server/consistency/policy.h"
#include "server/coordinator.h"
#include "server/ps_stats.h"
#include "server/request.h"
#include "server/shard_file.h"
#include "server/update_payload.h"
#include "shared/messages.h"

namespace pstrain::ps {

class ChunkHandlers {
 public:
  // The snapshot op writes `snapshot_cut()`'s cut (server/shard_file.h)
  // to `snapshot_file`.
  // `coordinator` counts the updates applied (Coordinator::applied_update).
  // `stats` counts refused updates.
  // `consistency` picks the policy pushes and pulls go through.
  ChunkHandlers(ChunkStore& store, Coordinator& coordinator, ReplySink& sink, PsStats& stats,
                std::filesystem::path snapshot_file, std::function<ShardCut()> snapshot_cut,
                const Consistency& consistency = {});

  // Registers init, pull, push, push_pull, assign and snapshot.
  void add_handlers(Handlers& handlers);
  // For a shard's copy: the same, and step (a primary's step in mode
  // backup, ConsistencyPolicy::on_step).
  void add_copy_handlers(Handlers& handlers);

  // Each throws std::invalid_argument naming the chunk when it is unknown
  // (init: exists with another size) or the payload has the wrong size.
  void init(const Request& request);
  void pull(const Request& request);
  void push(const Request& request);  // push and push_pull
  void assign(const Request& request);
  void step(const Request& request);
  // Replies when the file is written (tick()); a snapshot requested while
  // one is written waits for that one first.
  void snapshot(const Request& request);

  // On the ps thread, between requests: answers a snapshot whose file is
  // written (or whose write failed), and the held replies that workers lost
  // or finished since release.
  void tick();
  // Waits for a snapshot being written and answers it; the destructor too.
  void finish();
  // What the mode did, for the end of the ps's log (ssp: the largest
  // staleness against the bound; backup: steps applied, gradients dropped).
  void log_summary() const { policy_->log_summary(); }
  // The mode's per-worker clocks (ConsistencyPolicy::worker_clocks).
  std::vector<std::uint64_t> worker_clocks() const { return policy_->worker_clocks(); }
  void adopt_worker_clocks(std::span<const std::uint64_t> clocks) {
    policy_->adopt_worker_clocks(clocks);
  }
  ~ChunkHandlers();
  ChunkHandlers(const ChunkHandlers&) = delete;
  ChunkHandlers& operator=(const ChunkHandlers&) = delete;

 private:
  struct SnapshotWrite {
    Request request;
    std::filesystem::path path;
    std::size_t chunks = 0;
    std::string error;  // the writer's, read once `done`
    std::atomic<bool> done{false};
    std::thread writer;
  };
  void answer_snapshot();

  ChunkStore& store_;
  Coordinator& coordinator_;
  ReplySink& sink_;
  NonfiniteRefusal nonfinite_;
  std::filesystem::path snapshot_file_;
  std::function<ShardCut()> snapshot_cut_;
  std::unique_ptr<SnapshotWrite> snapshot_;  // the one being written, if any
  std::unique_ptr<ConsistencyPolicy> policy_;
};

}  // namespace pstrain::ps
