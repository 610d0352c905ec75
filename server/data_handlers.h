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
// In modes ssp and backup pushes and pulls are answered as those modes say
// (server/ssp_gate.h, server/backup_aggregator.h): a reply may be held
// until the slowest worker catches up, or until a step has its gradients;
// tick() lets go of what the coordinator's news (a worker lost or finished)
// releases. A resend of a held request is answered by the held reply.
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
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "server/backup_aggregator.h"
#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/ps_stats.h"
#include "server/request.h"
#include "server/ssp_gate.h"
#include "shared/config.h"
#include "shared/messages.h"

namespace pstrain::ps {

// How the ps answers pushes and pulls (ClusterConfig::mode and its train.*
// keys). Modes other than ssp and backup are answered as async: the ps of
// an all-reduce mode only receives worker 0's assigns.
struct Consistency {
  Mode mode = Mode::async;
  std::uint32_t workers = 0;
  std::uint64_t staleness_bound = 0;  // ssp
  std::uint32_t backup_workers = 0;   // backup
  // backup: a step's mean applied with the learning rate times the
  // gradients it averages (train.lr_scaling: the linear scaling rule),
  // times the micro-batches each of them averages (train.accumulate_steps).
  bool lr_scaling = false;
  std::uint32_t accumulate_steps = 1;
};

class DataHandlers {
 public:
  // `run_dir` and `ps_index` place the snapshot file; `config_hash` is
  // written in it.
  // `coordinator` counts the updates applied (Coordinator::applied_update).
  // `stats` counts refused updates.
  DataHandlers(ChunkStore& store, Coordinator& coordinator, ReplySink& sink, PsStats& stats,
               std::filesystem::path run_dir, std::uint32_t ps_index, std::uint64_t config_hash,
               Consistency consistency = {});

  // Registers init, pull, push, push_pull, assign and snapshot.
  void add_handlers(Handlers& handlers);

  // Each throws std::invalid_argument naming the chunk when it is unknown
  // (init: exists with another size) or the payload has the wrong size.
  void init(const Request& request);
  void pull(const Request& request);
  void push(const Request& request);  // push and push_pull
  void assign(const Request& request);
  // Replies when the file is written (tick()); a snapshot requested while
  // one is written waits for that one first.
  void snapshot(const Request& request);

  // On the ps thread, between requests: answers a snapshot whose file is
  // written (or whose write failed), and the held replies that workers lost
  // or finished since release.
  void tick();
  // Waits for a snapshot being written and answers it; the destructor too.
  void finish();
  // Modes ssp and backup: logs what the mode did (the largest staleness of
  // an applied update against the bound; steps applied and late gradients
  // dropped), for the end of the ps's log.
  void log_summary() const;
  ~DataHandlers();
  DataHandlers(const DataHandlers&) = delete;
  DataHandlers& operator=(const DataHandlers&) = delete;

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
  // Throws std::invalid_argument (after counting and logging) unless every
  // value of an update is finite.
  void refuse_nonfinite(const Request& request, std::span<const float> values);

  void reply_version(const Request& request, const Chunk& chunk);
  void reply_values(const Request& request, const Chunk& chunk);
  // A push's or push_pull's answer: the version, or the values.
  void reply_update(const Request& request, const Chunk& chunk);
  const Chunk& chunk_of(const wire::ChunkRequest& id) const;

  // Mode ssp: the fewest steps a worker not lost completed, and the reads
  // `slowest` lets go.
  std::uint64_t slowest() const;
  void release_reads(std::uint64_t slowest);
  // Mode backup: a gradient for its step; a step's mean applied.
  void push_backup(const Request& request, const wire::ChunkRequest& id,
                   std::span<const float> grad);
  void apply_step(const BackupAggregator::Step& step);
  void count_held();

  ChunkStore& store_;
  Coordinator& coordinator_;
  ReplySink& sink_;
  PsStats& stats_;
  std::set<std::uint32_t> poisoners_;  // senders whose refusal was logged
  std::filesystem::path run_dir_;
  std::uint32_t ps_index_;
  std::uint64_t config_hash_;
  std::unique_ptr<SnapshotWrite> snapshot_;                  // the one being written, if any
  std::optional<SspGate> ssp_;                               // mode ssp
  std::optional<BackupAggregator> backup_;                   // mode backup
  bool lr_scaling_ = false;                                  // mode backup
  std::uint32_t accumulate_steps_ = 1;                       // mode backup
  std::uint64_t largest_staleness_ = 0;                      // mode ssp
  std::uint64_t steps_applied_ = 0, gradients_dropped_ = 0;  // mode backup
};

}  // namespace pstrain::ps
