#pragma once
// Chain replication of a ps's shard (replication.replicas: 2;
// docs/failures.md, "Replicated shards"), after the parameter server of Li
// et al. (OSDI 2014): every update this ps applies to its shard (init, push,
// push_pull, assign, sparse_push, sparse_push_pull: chunks and embedding
// rows) is forwarded, as the frames it arrived in, to the next
// ps of the ring, its backup, which applies it to its copy of the shard while
// this ps applies it to the shard; the reply to the worker is held until the
// backup has answered. So every update
// a worker saw acknowledged is held by two processes.
//
//   Replicator replicator(context, {.ps_index = 0, .backup_address = ...}, stats, wire);
//   dispatcher.set_replicator(&replicator);  // forwards updates, holds their replies
//   poll replicator.socket(); on input: replicator.receive(now); each pass: tick(now)
//
// The backup keeps the copy apart from its own shard (its own chunk store
// and table store, served by the handlers Dispatcher::replica_handlers()
// holds) and forwards
// nothing further. A forward carries the worker's sender, incarnation and
// request id, so the backup's record of applied requests (server/dedup.h)
// holds it as the primary's does: a forward sent again (its answer lost) is
// answered from the record, not applied twice; and a resend of the worker
// that arrives while its reply is held here is answered once the backup has
// the update.
//
// Order: forwards leave on one connection in the order their updates are
// applied, all at one priority, and the backup serves one connection's
// requests of one priority in order, so each chunk goes through
// the same sequence of updates on both and ends bit-equal. The checks that
// refuse an update (its size, a NaN) are the same on both, so the backup
// refuses what this ps refuses; its refusal of an update this ps refused too
// is not waited for. Updates of
// senders that never resend (incarnation 0: tools speaking the wire by hand)
// are forwarded once and answered at once: without an id the backup records,
// a second forward could apply twice.
//
// A forward unanswered is sent again after min(net.retry_interval,
// backup_silence / 4), then after twice as long each time, up to
// backup_silence / 4. A backup that answered once and then nothing (neither
// pings nor forwards) for replication.backup_silence, refuses a forward, or
// answers from a new process (it restarted without the copy: replies carry
// their process's generation), is given up (one that never answered is
// waited for, this ps serving nothing meanwhile): the held replies are released, the loss is logged
// and counted, and this ps serves on without a backup (the shard then has one copy). It keeps
// telling the backup so (a ping marked "given up") until the backup has heard it, so that a backup
// that was only stopped never takes over with a copy that misses updates.
//
// Fail-over and the lease (docs/failures.md, "Fail-over"). Every
// backup_silence / 8 this ps pings its backup; an answer to a ping or a
// forward sent at time t lets this ps serve its shard until t +
// backup_silence / 2 (its lease). Without a valid lease (at start, or when
// the backup has not answered for a while) this ps leaves data requests
// unanswered, as a dead one would, and workers try the backup. The backup
// takes the shard over only after it has heard nothing from this ps for
// backup_silence: since it heard the last ping at or after t, this ps's lease
// has run out before the backup serves, so two never serve one shard at
// once, whether this ps died or was only stopped (SIGSTOP) or starved. Once
// it took over, the backup refuses this ps's forwards and pings as
// kTakenOver, and this ps stops serving the shard for good (fenced): the
// replies it held are dropped, their workers resend them to the backup,
// whose record of the forwarded requests applies each once. Silences are
// measured only while this ps runs: a tick long after the previous one (the
// process was stopped) starts the backup's silence afresh instead of giving
// it up.
//
// Re-join (docs/failures.md, "Re-join"). A primary that gave its backup up
// keeps pinging it; once the backup answers again (it was continued, or a
// new process of it started) and has heard the notice, this ps copies its
// whole shard to it in one ping (shard(), server/shard_state.h: chunks,
// optimizer state, versions, table rows, mode ssp's worker clocks and the
// record of applied requests) and
// forwards every later update as before, on the same connection, so the
// backup applies them to the copy in order; the backup's answer renews the
// lease and the shard has two copies again. A new process of this ps (a
// restart) gets its shard from the backup in the answer to its first ping
// (pings say kJoining until then, and no answer gives a lease before the
// shard is settled) when the backup held a copy (adopt): it serves the
// shard then with every update the old process acknowledged, from the copy,
// and the backup keeps its copy as before. A copy to a backup is confirmed
// by its answer: a later ping answered first, or a new process of the
// backup answering, means it was lost. A shard's state travels in pieces of
// one message each (server/shard_state.h): the copy to a backup as pings
// back to back, answered once all arrived; a hand-back as answers to pings,
// each asking for the next piece.
//
// Thread rules: the ps thread only, like the whole ps (server/request.h); the
// socket lives in the request loop's ZeroMQ context.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/ps_stats.h"
#include "server/request.h"
#include "server/shard_state.h"
#include "shared/curve_keys.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace pstrain::ps {

struct ReplicatorOptions {
  std::uint32_t ps_index = 0;
  std::uint64_t run_id = 0;  // pings carry it (ClusterConfig::run_id)
  std::uint32_t backup_index = 1;
  std::string backup_address;  // "tcp://host:port", where the backup serves
  // Under security.curve: this ps's key pair and the backup's public key.
  std::optional<std::pair<CurveKeyPair, std::string>> curve;
  Clock::duration retry_interval = std::chrono::seconds(1);  // a forward unanswered: sent again
  Clock::duration backup_silence = std::chrono::seconds(2);  // then the backup is given up
};

class Replicator {
 public:
  // The identities the forwards of ps `primary` arrive from at its backup
  // begin with peer_of(primary) (kPeerPrefix, the index and a slash); each
  // replicator adds a random part, so that a restarted primary's connection
  // never competes with its predecessor's for one identity. Under CURVE the
  // backup admits forwards only from the primary's key (server/rights.h),
  // whatever identity a peer claims.
  static constexpr std::string_view kPeerPrefix = "pstrain-replica-of-ps-";
  static std::string peer_of(std::uint32_t primary);
  // The beginning of the error a backup that took over answers forwards
  // and pings with.
  static constexpr std::string_view kTakenOver = "taken over: ";
  // A ping's operand when this ps gave its backup up: the backup's copy
  // misses updates from then on, and it must never take over with it.
  static constexpr std::uint64_t kGivenUp = 1;
  // A ping's operand when it carries this ps's shard's state (re-join): the
  // backup's copy becomes that.
  static constexpr std::uint64_t kResync = 2;
  // A ping's operand while this process has not settled its shard yet (at
  // start): a backup holding a copy for it answers with the copy, again to
  // every such ping until one is answered, since an answer may be lost.
  static constexpr std::uint64_t kJoining = 3;

  Replicator(zmq::context_t& context, ReplicatorOptions options, PsStats& stats, ReplySink& wire);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Whether updates are forwarded: until the backup is given up.
  bool active() const { return active_; }
  // Whether the backup took this ps's shard over: this ps has nothing left
  // to serve of it (the request loop ends).
  bool fenced() const { return fenced_; }
  // Whether this ps may serve its shard's data requests at `now`: with a
  // backup, while its lease lasts; without one (given up), always; never
  // once the backup took over.
  bool serving(Clock::time_point now) const { return !fenced_ && (!active_ || now < lease_until_); }
  // Forwards the update `request` (its header frame and payload frames, as
  // received) that this ps is about to apply: the backup applies it while
  // this ps does, and the two keep the order of their forwards.
  void forward(std::span<const std::span<const std::uint8_t>> frames, const wire::Header& request);
  // The reply to a forwarded `request`, due to `to` (or to the peer of a
  // resend held() saw meanwhile): taken (true) and held until the backup has
  // applied the update; false when nothing is waited for (not forwarded, or
  // from a sender that never resends; with `deferred_only`, also when its
  // reply was not deferred) and the caller sends it.
  bool hold(const wire::Header& request, const Peer& to, Reply& reply, bool deferred_only = false);
  // `request` was handled without a reply to hold (this ps refused it), or
  // its handler `failed` (threw, even after defer()): its forward is not
  // waited for.
  void settle(const wire::Header& request, bool failed = false);
  // `request` was applied but its reply comes later (mode ssp holds a
  // push_pull's read until the slowest worker catches up): settle() keeps
  // waiting for its forward, and hold() takes the reply when it comes.
  void defer(const wire::Header& request);
  // A resend of `request` arrived from `to`: true when its reply is held
  // here (it then goes to `to` once released); false when the caller
  // answers it.
  bool held(const wire::Header& request, const Peer& to);
  // Mode backup: this ps applied a step of a chunk, the mean of the
  // gradients of `contributors` (whose forwards went before). Forwarded as
  // wire::Op::step, sent again until answered like an update: the backup
  // applies that mean to its copy rather than collect a step of its own
  // (which gradients make a step depends on which workers this ps counts as
  // training), and the contributors' replies also wait for its answer.
  void forward_step(const wire::StepRequest& step, std::span<const float> mean,
                    std::span<const Request> contributors);

  // Re-join: `cut` encodes this ps's shard as it is now (copied to a backup
  // given up before that answers again), `adopt` replaces the shard with a
  // state the backup handed back (throws when it does not fit). Without
  // them a given-up backup stays given up.
  void set_shard(std::function<std::vector<std::uint8_t>()> cut,
                 std::function<void(std::span<const std::uint8_t>)> adopt);

  zmq::socket_t& socket() { return *socket_; }
  // Reads the backup's answers and releases the replies they free.
  void receive(Clock::time_point now);
  // Forwards unanswered for a retry interval go out again; a backup silent
  // for backup_silence is given up; pings that are due go out.
  void tick(Clock::time_point now);

 private:
  struct Held;
  using Key = std::pair<std::uint64_t, std::uint64_t>;  // (incarnation, request id)
  // A forward of `frames` sent now, held until the backup answers it.
  Held send_held(std::vector<std::shared_ptr<const std::vector<std::uint8_t>>> frames);
  void send(const Held& held);
  // Sends `it`'s reply, which the backup and any step it waits for have
  // answered, and forgets it.
  void release(std::map<Key, Held>::iterator it);
  Clock::duration resend_interval() const;
  void give_up(const std::string& why);
  void fence(const std::string& why);
  // `next_piece`: asks for the hand-back's next piece now (one arrived).
  void ping(Clock::time_point now, bool next_piece = false);
  // An answer (ok) to what was sent at `sent`: the lease runs from there.
  void renew(Clock::time_point sent);
  // Copies the shard to the backup (a ping of kResync) and forwards again.
  void resync(Clock::time_point now);
  // A piece of the shard's state the backup hands back, in its answer to a
  // ping sent at `sent`: the next is asked for at once, and the whole is
  // adopted.
  void take_piece(const wire::Header& answer, std::span<const std::uint8_t> bytes,
                  Clock::time_point sent, Clock::time_point now);
  // The shard's state the backup handed back (in `pieces` messages), asked
  // for at `sent`.
  void adopt(std::span<const std::uint8_t> state, Clock::time_point sent, std::uint64_t pieces);
  void count_pending();
  // The step forward `it` was answered: the replies that waited for it go.
  void step_answered(std::map<Key, Held>::iterator it);

  ReplicatorOptions options_;
  PsStats& stats_;
  ReplySink& wire_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::map<Key, Held> held_;
  // Step forwards are keyed (step_incarnation_, a sequence number): the
  // backup's record answers one sent again, as it does a worker's update.
  std::uint64_t step_incarnation_ = 0;  // random, nonzero
  std::uint64_t next_step_id_ = 1;
  bool active_ = true;
  bool fenced_ = false;                  // the backup took the shard over
  bool backup_seen_ = false;             // the backup answered once
  std::uint64_t backup_generation_ = 0;  // its process's (wire::Header::generation)
  bool waiting_logged_ = false;
  Clock::time_point last_heard_;  // the backup's last answer (or the start)
  Clock::time_point last_tick_;
  Clock::time_point lease_until_{};  // none at start
  // Pings in flight by request id (incarnation 0): when sent, and whether
  // they said the backup is given up; bounded by dropping those older than
  // backup_silence.
  struct Ping {
    Clock::time_point sent;
    std::uint64_t operand = 0;  // 0, kGivenUp, kResync or kJoining
  };
  std::map<std::uint64_t, Ping> pings_;
  std::uint64_t next_ping_id_ = 1;
  Clock::time_point next_ping_at_{};
  bool notice_due_ = false;  // given up: the backup has not yet heard so
  // Re-join: the shard as state, and its adoption (set_shard); when the
  // backup last answered anything, and when the last copy was sent.
  std::function<std::vector<std::uint8_t>()> cut_;
  std::function<void(std::span<const std::uint8_t>)> adopt_;
  Clock::time_point answered_at_{};
  Clock::time_point resync_sent_{};
  bool cannot_resync_ = false;   // the shard is larger than a ps sends (max_state_bytes)
  std::uint64_t resync_id_ = 0;  // the copy's ping, until answered
  // At start, until the backup answered a ping with this ps's shard (or with
  // nothing to hand back): no lease meanwhile.
  bool joining_ = true;
  // The shard handed back so far, and when its first piece was asked for.
  StateAssembly handback_;
  Clock::time_point handback_asked_{};
  Clock::time_point last_piece_{};  // a piece arrived or was asked for
};

}  // namespace pstrain::ps
