#pragma once
// The ps's request path without its socket: one received message (its
// frames as bytes) is cut into its requests, each decoded and checked (header, protocol version,
// config run id, payload frames against the header), handed to the handler its op has in
// handlers(), and every reply on its way out passes send(). A message that cannot be decoded or a
// handler that throws gets an error reply.
//
// A request with another run id is refused before anything else looks at
// it. The reply says which kind of mismatch it is (another launch of this
// config, a different config naming the differing keys, or neither known:
// a request without the hello's config) and never the ps's run id or config
// values: the peer has not shown it belongs to the run. The ps's log names
// the values, for the first kMaxLoggedRefusals refusals. Every well-formed
// request of the run is then admitted by the coordinator
// (Coordinator::admit: a worker index is held by one process at a time)
// before its handler runs.
//
// With options.rights (security.curve) each request is first checked against
// the rights of the identity its connection's key has (server/rights.h);
// a refusal gets an error reply naming the op and the missing right, is
// counted (PsStats::refused) and logged once per peer address and op.
//
// The dispatcher also keeps the record of applied updates (server/dedup.h): a
// resent update is answered from it (push_pull through the pull handler)
// instead of reaching its handler, and a resend too old to tell is refused.
//
// With replication (server/replicator.h) the dispatcher forwards each
// update of its own shard to the backup before its handler applies it, and
// hands the handler's reply to the replicator, which holds it until the
// backup has the update; and it serves the forwards of the
// ps before it in the ring (peers Replicator::peer_of names) with the
// handlers of replica_handlers(), over the copy of that ps's shard, without
// admission (the primary admitted them) and without forwarding them further.
//
// Fail-over (server/replicator.h, "Fail-over and the lease"): a primary
// without a valid lease leaves its shard's data requests unanswered. The
// backup answers the primary's pings, notes when it last heard the primary
// (measured only while it runs: watch()), and takes the shard over when a
// worker's data request for it arrives (from a socket named
// wire::failover_peer) after the primary has been silent for
// replication.backup_silence; until then such requests go unanswered. From
// then on it serves them (and the snapshot op, which writes the copy as that
// ps's snapshot file) over the copy, with the copy's record of applied
// requests (which holds every forwarded one, so a resend of an update the
// primary forwarded is answered, not applied again), and refuses the
// primary's forwards and pings (Replicator::kTakenOver). A new process of the
// primary (a restart: its replicator's identity changes) makes this ps take
// the shard over at once, since the copy holds every acknowledged update and
// the restarted primary at best an older checkpoint. A copy its primary gave
// up (a ping said so) misses updates: it is never taken over, and a new
// process of the primary is refused as its primary (it then serves alone).
//
// Re-join (server/replicator.h, "Re-join"): a new process of the primary
// that pings (a restart) gets the copy's whole state in the ping's answer
// (server/shard_state.h) and serves the shard again; this ps goes back to
// keeping the copy, and answers a worker's fail-over requests for the shard
// with wire::kMovedBack while the primary is heard, which sends the worker
// back to it. A primary's ping that carries its shard's state (a primary
// copying its shard to a backup it had given up) replaces the copy with it.
//
// The request loop (server/request_loop.h) feeds it what its ROUTER socket
// receives and sends what it passes on; the fuzzer (tests/fuzz) feeds it
// made-up messages and records the replies, so both exercise one path.
//
//   Dispatcher dispatcher({.ps_index = 0, .run_id = hash}, stats, wire_sink);
//   coordinator.add_handlers(dispatcher.handlers());  // handlers reply to `dispatcher`
//   dispatcher.handle(coordinator, frames, Clock::now());
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/dedup.h"
#include "server/ps_stats.h"
#include "server/replicator.h"
#include "server/request.h"
#include "server/rights.h"
#include "server/shard_state.h"
#include "shared/curve_keys.h"

namespace pstrain::ps {

// One frame of a received message, valid while handle() runs.
using Frame = std::span<const std::uint8_t>;

struct DispatcherOptions {
  std::uint32_t ps_index = 0;
  std::uint64_t run_id = 0;       // every request must carry it (ClusterConfig::run_id)
  std::uint64_t config_hash = 0;  // ClusterConfig::hash: a hello of another launch has it
  std::string config_yaml;        // ours, to name the keys a hello's config differs in
  // Under CURVE: what each authenticated identity may do. None: nobody is
  // authenticated and nothing is checked.
  std::optional<RightsPolicy> rights;
  // replication.replicas 2: the ps whose shard this one keeps a copy of,
  // and how long that ps must be silent before this one takes the shard over.
  std::optional<std::uint32_t> replica_of;
  Clock::duration backup_silence = std::chrono::seconds(2);
};

// A shard for re-join, as the ps role holds it: its chunks, tables and the
// mode's per-worker clocks read as they are now, or replaced whole by a
// shard state's (whose record of applied requests the dispatcher keeps).
struct ShardAccess {
  std::function<std::vector<HeldChunk>()> chunks;
  TableStore* tables = nullptr;  // none: the shard has no tables
  std::function<std::vector<std::uint64_t>()> clocks;
  std::function<void(ShardState)> replace;
};

// What the socket knows of a message's sender.
struct Connection {
  std::optional<Identity> identity;  // from its CURVE key; none without CURVE
  std::string address;               // its IP address, for the log
};

class Dispatcher final : public ReplySink {
 public:
  // Refused run ids logged with their details; later ones only counted
  // (stats: errors), so that a peer cannot fill the log.
  static constexpr std::size_t kMaxLoggedRefusals = 32;

  // Replies leave through `wire` once send() has looked at them.
  Dispatcher(DispatcherOptions options, PsStats& stats, ReplySink& wire);

  Handlers& handlers() { return handlers_; }
  // The handlers of the forwards of ps options.replica_of (its shard's copy).
  Handlers& replica_handlers() { return replica_handlers_; }
  // Applied updates go to `replicator` (none: they are answered at once).
  void set_replicator(Replicator* replicator) { replicator_ = replicator; }
  // Called on every pass of the request loop: a pass long after the
  // previous one (the process was stopped) starts the primary's silence
  // afresh, since this ps did not listen meanwhile.
  void watch(Clock::time_point now);
  // Called on every pass of the request loop too: hellos that came while
  // this ps had no lease from its backup are answered once it has one
  // (those older than backup_silence are dropped: their senders asked the
  // backup meanwhile).
  void resume(Coordinator& coordinator, Clock::time_point now);
  bool took_over() const { return took_over_; }
  // Re-join: this ps's own shard and the copy it keeps, as the ps role
  // holds them (none: re-join is off, a restarted primary is served as
  // before: the copy taken over).
  void set_shards(ShardAccess own, ShardAccess copy);
  // This ps's shard's state with its record of applied requests
  // (server/shard_state.h), to copy to a backup; and one handed back by
  // the backup, which replaces both (throws ShardStateError, or
  // std::invalid_argument when it does not fit the store).
  std::vector<std::uint8_t> own_state() const;
  void adopt_own_state(std::span<const std::uint8_t> bytes);

  // Handles one message: frames[0] is the sender's identity (where replies
  // go; a ROUTER socket always puts it there), then one or more requests,
  // each a header frame and the payload frames it declares, handled in
  // order. Frames that do not cut into requests, or more than
  // wire::kMaxRequestsPerMessage requests, get one error reply (to the
  // first request) and nothing is handled; anything else wrong gets the
  // request's error reply; nothing throws. `received` is the message's
  // arrival time.
  void handle(Coordinator& coordinator, std::span<const Frame> frames, Clock::time_point received,
              const Connection& connection = {});

  // Every reply, the handlers' included: records an applied update's reply
  // in the dedup record, then passes it to the wire sink, or with
  // replication to the replicator, which holds the reply to an update of
  // this ps's shard (now, or later when a handler held it) until the backup
  // has the update.
  void send(const Peer& to, Reply reply) override;
  // Records the update of the request being handled, whose reply a
  // handler holds (ReplySink::accepted); with replication, its reply will
  // wait for the forward whenever it comes (Replicator::defer).
  void accepted(const wire::Header& request, std::uint64_t version) override;
  // Mode backup's step of this ps's own shard goes to the backup
  // (Replicator::forward_step).
  void applied_step(const wire::StepRequest& step, std::span<const float> mean,
                    std::span<const Request> contributors) override;

 private:
  // Answers `request` with an error saying `text` (counted: errors).
  void refuse(const Request& request, std::string text);
  // dispatch(), an exception turned into the request's error reply.
  void serve(Coordinator& coordinator, Request& request, std::span<const Frame> payloads,
             const Connection& connection);
  void dispatch(Coordinator& coordinator, Request& request, std::span<const Frame> payloads,
                const Connection& connection);
  // Why `connection` may not send `request` (nullopt: it may); logs the
  // first refusal per peer address and op.
  std::optional<std::string> refusal_of(const Connection& connection, const wire::Header& request,
                                        bool forward);
  void answer_resend(const Handlers& handlers, const Request& request, std::uint64_t version);
  // Whether `from` is the replicator of options_.replica_of; throws for one
  // that claims to be another ps's.
  bool forwarded(const Peer& from) const;
  // Whether `from` is a worker's socket for options_.replica_of's shard
  // (wire::failover_peer); throws for one of another ps's shard.
  bool failing_over(const Peer& from) const;
  // Whether `from`'s identity is `prefix`, options_.replica_of and a slash
  // (then more); throws, naming `what`, for one of another ps.
  bool names_copy(const Peer& from, std::string_view prefix, const std::string& what) const;
  // A request from the primary (a forward or a ping): refused once this ps
  // took over; true when it was a ping, answered here.
  bool heard_primary(const Request& request);
  // A worker's request for the primary's shard: whether this ps serves it,
  // taking the shard over if the primary has been silent long enough.
  bool take_over(const Request& request);
  // A worker's data request for a shard handed back to the primary, which
  // is heard: answered wire::kMovedBack (true), so it goes there again.
  bool moved_back(const Request& request);
  // A new process of the primary pings: it gets the copy's state in the
  // answer and serves the shard again. False when it cannot be handed
  // back (re-join off, or the state too large): the caller takes over.
  bool hand_back(const Request& request);
  // The primary's ping with its shard's state: the copy becomes that.
  void adopt_copy(const Request& request);
  void check(const wire::Header& request, std::span<const Frame> payloads) const;
  void check_run(const wire::Header& request);
  std::string prefix() const;

  DispatcherOptions options_;
  PsStats& stats_;
  ReplySink& wire_;
  Handlers handlers_;
  Handlers replica_handlers_;
  Replicator* replicator_ = nullptr;
  Dedup dedup_;
  Dedup replica_dedup_;  // of the forwards served (their own ids' window)
  // While a recorded op's handler runs: its request and sender, whose reply
  // send() records in the dedup record (a held reply to another sender that
  // the handler releases may carry the same request id).
  const wire::Header* recording_ = nullptr;
  const Peer* recording_from_ = nullptr;
  // The recorded request's frames (header, payloads), for the replicator;
  // whether it is itself a forward (then not forwarded again).
  std::span<const Frame> recording_frames_;
  bool recording_forward_ = false;
  std::size_t refusals_logged_ = 0;  // check_run
  // Fail-over, as the backup of options_.replica_of.
  Clock::time_point primary_heard_ = Clock::now();
  Clock::time_point last_watch_ = primary_heard_;
  bool primary_seen_ = false;  // a shard is taken over only from a primary that served
  Peer primary_peer_;          // the identity of the primary's replicator
  // Identities of the primary's earlier processes, refused (bounded).
  std::deque<Peer> superseded_;
  static constexpr std::size_t kMaxSuperseded = 16;
  void set_primary(const Peer& peer);
  bool took_over_ = false;
  bool copy_given_up_ = false;
  bool handed_back_ = false;  // to a new process of the primary, which serves it
  bool waiting_logged_ = false;
  // Hellos waiting for the lease (resume()); bounded, oldest dropped.
  std::deque<std::pair<Request, Connection>> parked_hellos_;
  static constexpr std::size_t kMaxParkedHellos = 256;
  std::optional<ShardAccess> own_;  // re-join on (set_shards)
  std::optional<ShardAccess> copy_;
  // The hand-back being fetched by a new process of the primary, piece by
  // piece: the copy as cut for it (it stays unchanged meanwhile: that
  // process serves nothing yet), and the cut's id; let go once it serves.
  std::shared_ptr<const std::vector<std::uint8_t>> handback_;
  Peer handback_to_;
  std::uint64_t handback_id_ = 0;
  std::size_t handback_chunks_ = 0;  // in that cut
  // A copy the primary sends in pieces (its ping of Replicator::kResync).
  StateAssembly copy_pieces_;
  // (peer address, op) pairs whose refusal was logged; bounded, the count
  // (PsStats::refused) has the rest.
  std::set<std::pair<std::string, wire::Op>> rights_refusals_logged_;
  static constexpr std::size_t kMaxRightsRefusalsLogged = 256;
};

}  // namespace pstrain::ps
