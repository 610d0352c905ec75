#pragma once
// The ps's coordination of its workers: barriers, the rendezvous key-value
// store, requests parked until something happens (each kv_get with its
// deadline), worker liveness and the global sample count, and when the ps
// should exit.
//
// No ZeroMQ and no clock of its own: requests come in as ps::Request (their
// `received` time is "now" for them), replies leave through the ReplySink,
// and tick() is given the time. Unit tests drive it with a recording sink
// and made-up times (tests/unit/test_coordinator.cc).
//
// Liveness: a worker is pending until its first message, then live until it
// sends done. A live worker silent for worker_timeout, or a pending one
// never heard within worker_timeout of start(), is lost; what follows is
// on_worker_loss (train.on_worker_loss):
// - fail: the ps exits 3 naming the silent workers;
// - continue: they are marked absent (logged by name) and the others go on.
//   A barrier releases once every live or pending worker has entered it
//   (absent and done ones cannot). An absent worker heard again (a restart
//   saying hello, a late heartbeat) is live again.
//
// One process per worker index: each worker process has an incarnation
// (random, new at every start; 0 for tools speaking the protocol by hand,
// which are not checked). The first incarnation heard for an index holds
// it. Another one is refused while the holder is live and was heard within
// takeover_silence (it heartbeats every liveness interval), with a reply
// that says when to ask again; once the holder is silent that long (killed),
// absent or done, the newcomer takes the index over: a restart. A taken-over
// incarnation stays refused for good, so a process that was only stopped
// cannot act for the index again. A refused request changes nothing and
// does not count as hearing from the worker.
//
// Exit policy (exit_code()): 0 after a shutdown request, or once no worker is
// live or pending and at least one sent done (all of them, unless some were
// lost under `continue`); 3 on a loss under `fail`, or once every worker is
// lost, which includes a ps no worker ever contacts. On exit 3 every parked
// request is answered with an error naming the silent workers, so nobody
// waits for a ps that is about to go.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/request.h"
#include "shared/config.h"
#include "shared/snapshot.h"

namespace pstrain::ps {

struct CoordinatorOptions {
  std::string name;           // "ps 0": starts the text of the errors it sends
  std::uint32_t workers = 0;  // senders 0 .. workers-1 are workers; others are tools
  std::chrono::duration<double> worker_timeout{60};  // net.worker_timeout
  WorkerLoss on_worker_loss = WorkerLoss::fail;      // train.on_worker_loss
  // How long a worker index's holder must be silent before another process
  // may take it over (shared/config.h, takeover_silence).
  std::chrono::duration<double> takeover_silence{3};
};

class Coordinator {
 public:
  // The longest a kv_get may wait.
  static constexpr std::uint64_t kMaxKvGetTimeoutMs = 86'400'000;
  // What the key-value store may hold, so that no peer can make the ps grow
  // without bound through kv_set: rendezvous needs a few keys per worker and
  // attempt, of a few bytes (Gloo addresses, NCCL's 128-byte id).
  static constexpr std::size_t kMaxKvKeys = 4096;
  static constexpr std::size_t kMaxKvBytes = 64 << 20;  // values, all keys together
  // Requests parked at once (barrier entries and kv_gets together), per peer
  // (one client connection) and for the whole ps, and barriers open at once
  // (entered, not yet released): a worker parks one barrier entry and a few
  // kv_gets at a time. A request beyond them is refused with an error naming
  // the limit, and parks nothing.
  static constexpr std::size_t kMaxParkedPerPeer = 64;
  static constexpr std::size_t kMaxParked = 4096;
  static constexpr std::size_t kMaxBarriers = 256;

  Coordinator(CoordinatorOptions options, ReplySink& sink);

  // Registers hello, barrier, kv_set, kv_get, heartbeat, progress, done and
  // shutdown.
  void add_handlers(Handlers& handlers);

  // The handlers (requests read through shared/messages.h). Each throws
  // std::invalid_argument for a request it refuses, before changing anything.
  // Replies with the number of workers and the updates the chunks hold. A
  // worker's hello also says how many of its updates it saw acknowledged:
  // after a restore, those beyond the restored count were lost, which is
  // logged and counted (Figures::updates_lost).
  void hello(const Request& request);
  // Parks until `count` senders entered; refuses a new barrier beyond
  // kMaxBarriers and an entry beyond the kMaxParked* limits.
  void barrier(const Request& request);
  // Replies, then answers the kv_gets parked for its key (and no others);
  // refuses a new key beyond kMaxKvKeys and a value that would take the
  // store past kMaxKvBytes. The value is stored once and every kv_get's
  // reply shares it (SharedBytes).
  void kv_set(const Request& request);
  // Replies, or parks until set or deadline; refuses to park beyond the
  // kMaxParked* limits.
  void kv_get(const Request& request);
  void heartbeat(const Request& request);  // workers only; liveness (every request is)
  void progress(const Request& request);   // workers only; adds to global samples
  void done(const Request& request);       // workers only
  void shutdown(const Request& request);

  // The ps serves from `now` on: pending workers are counted silent from
  // here. The request loop calls it once, before its first request; no
  // worker is timed out before.
  void start(Clock::time_point now);
  // Whether `request` may act for its sender (one process per worker index,
  // above); the request loop asks for every well-formed request of the run,
  // whatever its op, before its handler. Admitted: the sender is heard.
  // Refused: the error reply is sent, and false returned.
  bool admit(const Request& request);
  // Notes that `sender` was heard from at `at` (admit's liveness half).
  void heard(std::uint32_t sender, Clock::time_point at);
  // Answers the kv_gets whose deadline is past `now` (in deadline order,
  // touching none other), then applies the worker timeout.
  void tick(Clock::time_point now);
  // The earliest deadline of a parked kv_get, if any (no scan).
  std::optional<Clock::time_point> next_deadline() const;
  std::optional<int> exit_code() const { return exit_code_; }

  // What the stats op and the metrics report of the coordinator.
  struct WorkerFigures {
    const char* state = "pending";           // pending, live, absent or done (the liveness above)
    std::optional<Clock::time_point> heard;  // last heard; none before its first message
  };
  struct Figures {
    std::uint64_t global_samples = 0;
    std::size_t parked_barrier = 0;  // requests waiting in barriers
    std::size_t parked_kv_get = 0;   // kv_gets waiting for their key
    // Per worker: its acknowledged updates that restores of this ps lost.
    std::vector<std::uint64_t> updates_lost;
    std::vector<WorkerFigures> workers;  // per worker
  };
  Figures figures() const;
  std::uint64_t global_samples() const { return global_samples_; }
  // Whether worker `worker` was lost (absent under on_worker_loss:
  // continue); false for any other sender.
  bool absent(std::uint32_t worker) const;
  // Workers still training: pending or live (not done, not lost), and not
  // finished pushing (a progress report says so after a worker's last step; a
  // restarted process of it trains again).
  std::size_t workers_training() const;
  // What a checkpoint records of progress: the global samples and, per
  // worker, its samples (its progress reports' sum, or its done's total when
  // larger), its incarnation and the updates of it this ps applied.
  void fill_progress(SnapshotInfo& info) const;
  // Progress read back from a checkpoint or snapshot, and the updates the
  // restored chunks hold. The per-worker entries are taken from a checkpoint
  // with one per worker only: an end-of-run snapshot seeds a new run, whose
  // workers start their shards afresh.
  void restore_progress(const SnapshotInfo& info, std::uint64_t state_updates);
  // The chunks were replaced by a copy holding every update the workers saw
  // acknowledged (re-join, server/replicator.h), `state_updates` in all:
  // each worker's count starts afresh with its next hello, which so counts
  // nothing lost.
  void adopt_shard(std::uint64_t state_updates);
  // The chunk handlers applied one chunk update (push, push_pull, assign) of
  // `request`; a resend answered from the record is not applied again.
  void applied_update(const wire::Header& request);

 private:
  // A request waiting for its answer.
  struct Parked {
    Peer from;
    wire::Header request;
    Clock::time_point deadline{};  // kv_get only
  };
  struct Barrier {
    std::uint64_t count = 0;
    std::set<std::uint32_t> senders;
    std::vector<Parked> waiting;
  };
  enum class Liveness { pending, live, absent, done };
  // Taken-over incarnations remembered per worker index (refused for good).
  static constexpr std::size_t kReplacedKept = 16;
  struct Worker {
    Liveness state = Liveness::pending;
    Clock::time_point last{};             // last heard; live and absent workers only
    std::uint64_t incarnation = 0;        // the process holding the index; 0: none yet
    std::vector<std::uint64_t> replaced;  // oldest first, at most kReplacedKept
    std::uint64_t last_refused = 0;       // the newcomer whose refusal was logged last
    bool finished_pushing = false;        // its incarnation's last step is pushed
  };

  // A parked kv_get, indexed by its key (what kv_set looks up) and by its
  // deadline (what tick looks up) so that neither scans the others.
  struct KvWait {
    Parked parked;
    std::string key;
  };

  void fail(const Parked& parked, const std::string& why);
  // Throws unless one more request of `peer` may be parked; park() counts
  // it, unpark() when it is answered.
  void check_can_park(const Peer& peer) const;
  void park(const Peer& peer);
  void unpark(const Peer& peer);
  // Removes parked kv_get `id` from every index; returns it.
  Parked take_kv_wait(std::uint64_t id);
  void check_worker(std::uint32_t sender, const char* op) const;
  // admit()'s refusal: logged once per newcomer, answered with `why`.
  void refuse(const Request& request, Worker& w, const std::string& why,
              std::chrono::milliseconds retry_after);
  void expire_kv_gets(Clock::time_point now);
  void check_worker_timeout(Clock::time_point now);
  // Releases barrier `it` if count senders, or every worker that can still
  // enter, have entered; true if it did (and erased it).
  bool release_if_complete(std::map<std::string, Barrier, std::less<>>::iterator it);
  // The same for every barrier: after a worker was lost or finished.
  void release_complete_barriers();
  void check_exit();
  void fail_all_parked(const std::string& reason);
  std::string workers_in(Liveness state) const;

  CoordinatorOptions options_;
  ReplySink& sink_;
  std::map<std::string, Barrier, std::less<>> barriers_;
  std::map<std::string, SharedBytes, std::less<>> kv_;
  std::size_t kv_bytes_ = 0;  // of kv_'s values
  // Parked kv_gets by id (arrival order), by key and by deadline.
  std::uint64_t next_kv_wait_ = 0;
  std::map<std::uint64_t, KvWait> kv_waits_;
  std::map<std::string, std::set<std::uint64_t>, std::less<>> kv_waits_by_key_;
  std::set<std::pair<Clock::time_point, std::uint64_t>> kv_deadlines_;
  // Parked requests (barrier entries and kv_gets): per peer (peers with
  // none are not listed) and in all.
  std::map<Peer, std::size_t> parked_by_peer_;
  std::size_t parked_ = 0;
  std::vector<Worker> workers_;
  std::optional<Clock::time_point> started_;
  std::vector<std::uint64_t> worker_samples_;  // per worker
  // Per worker: the incarnation whose updates worker_updates_ counts, and
  // the updates lost to restores (hello compares counts).
  std::vector<std::uint64_t> worker_incarnations_, worker_updates_, updates_lost_;
  std::uint64_t state_updates_ = 0;  // updates the chunks hold: HelloReply
  std::uint64_t global_samples_ = 0;
  std::optional<int> exit_code_;
};

}  // namespace pstrain::ps
