#pragma once
// PsChannel: the wire under the ps clients (client/ps/ps_client.h). One
// ZeroMQ DEALER per ps; a request is a header frame and at most one payload
// frame, sent zero-copy from the caller's memory; replies are matched to
// requests by id and handed to the request's handler (data ops) or kept for
// the caller (control ops). ZeroMQ stays behind this class.
//
// A call is a ticket: open() it, send() one request per ps (or per chunk)
// under it, wait() for every reply. A payload sent zero-copy belongs to the
// channel until wait() on its ticket returns (or throws), which is also
// when ZeroMQ has let go of it.
//
// Failures: every wait has a deadline. A data request (init, pull, push,
// push_pull, assign) unanswered after retry_interval_s is resent, then after
// twice as long, and so on up to timeout_s / 4; the ps answers a resent
// update from its record instead of applying it twice (server/dedup.h). A
// ticket fails with PsSilent (a PsError) naming the ps when that ps has not answered for
// its timeout. A ps that does not read what was sent to it (stalled: it
// holds frames and sent no reply for retry_interval_s) keeps ZeroMQ from
// releasing the caller's buffers; its socket is then replaced, which frees
// them. Control requests are not resent.
//
// Restarts: every reply carries its ps's generation (wire::Header), new at
// every ps start. The channel remembers the latest per ps; a change means
// the ps restarted and may hold other values than this client last saw (and
// its record of applied requests started empty, so an update resent to it
// is applied there, once). Calls do not fail on a change: the caller asks
// take_generation_change() between steps and decides.
//
// Fail-over (replication.replicas 2, options.failover_after_s): when ps s
// has data requests in flight and has not answered for failover_after_s,
// their resends (every min(retry_interval_s, failover_after_s / 4)
// meanwhile) go to its backup, ps (s + 1) % servers, too, from a socket
// named wire::failover_peer(s). The backup answers them only once it took
// the shard over (server/replicator.h, "Fail-over and the lease"); its
// first answer moves shard s there for good: every later request for ps s
// goes to the backup, whose record of the forwarded updates applies each
// resent one once, until the backup answers one wire::kMovedBack: it
// handed the shard back to a new process of ps s (a restart that
// re-joined), and the requests go to ps s again. An answer of ps s itself first ends the trial. A
// ps whose shard moved leaves all_servers() (it no longer takes control requests) and its
// generation starts afresh from the backup's (not a restart). With fail-over only data replies tell
// a ps's generation: a restarted ps answers control requests before its backup fences it, and
// serves data only if it serves its shard itself.
//
// Thread rules: a channel is used by one thread (ZeroMQ sockets are not
// thread-safe); only ZeroMQ's I/O thread touches frames_held_, which is
// atomic for it.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/ps/ps_options.h"
#include "shared/fault.h"
#include "shared/protocol.h"

namespace zmq {
class context_t;
class socket_t;
class message_t;
}  // namespace zmq

namespace pstrain {

// An error reply that said when to ask again (wire::ErrorReply): a
// temporary refusal.
struct PsRetryLater : PsError {
  PsRetryLater(const std::string& what, std::chrono::milliseconds wait)
      : PsError(what), after(wait) {}
  std::chrono::milliseconds after;
};

// A ps that did not answer within the ticket's timeout.
struct PsSilent : PsError {
  using PsError::PsError;
};

class PsChannel {
 public:
  using Ticket = std::uint64_t;
  using Clock = std::chrono::steady_clock;

  // A control request's reply.
  struct Reply {
    std::uint32_t server = 0;
    wire::Header header;
    std::vector<std::uint8_t> bytes;  // its payload frame (kv_get), if any
  };
  // Takes the replies of the requests sent with it: `cookie` as given to
  // send(), the reply's header (status ok, the request's op, payload frames
  // checked against their declared sizes) and its payload frame (empty
  // without), with the ZeroMQ message that holds it (null without), which
  // the handler may take (move from) to read the payload later without a
  // copy; `payload` is not read after that. Throwing fails the ticket with
  // the exception's text.
  class ReplyHandler {
   public:
    virtual void on_reply(Ticket ticket, std::uint64_t cookie, const wire::Header& header,
                          std::span<const std::uint8_t> payload, zmq::message_t* message) = 0;

   protected:
    ~ReplyHandler() = default;
  };

  // `addresses[s]`: ps s's endpoint. Throws std::invalid_argument when
  // options.curve's server keys do not match the addresses.
  PsChannel(std::vector<std::string> addresses, std::uint64_t run_id, PsClientOptions options);
  ~PsChannel();
  PsChannel(const PsChannel&) = delete;
  PsChannel& operator=(const PsChannel&) = delete;

  std::uint32_t servers() const { return static_cast<std::uint32_t>(addresses_.size()); }
  const PsClientOptions& options() const { return options_; }
  // "ps 1 (tcp://host:port)", for messages.
  std::string where(std::uint32_t server) const;

  // A new ticket for `op` (its failures name `label`, a variable or key),
  // each of whose replies is awaited up to `timeout_s`.
  Ticket open(wire::Op op, std::string label, double timeout_s);
  // Sends one request of `ticket` to ps `server`. `data` (values or a
  // gradient, of h.dtype; a sparse op's ids) and `second` (a sparse push's
  // rows) go out zero-copy as payload frames; `bytes` (a small control
  // payload) is copied. Data ops are resent until answered. `handler`: takes
  // the reply (with `cookie`); none: wait() returns it.
  void send(Ticket ticket, std::uint32_t server, wire::Header h, std::span<const std::uint8_t> data,
            std::span<const std::uint8_t> bytes = {}, ReplyHandler* handler = nullptr,
            std::uint64_t cookie = 0, std::span<const std::uint8_t> second = {});
  // Waits for every reply of `ticket` and returns those without a handler,
  // by server. Throws PsError (PsRetryLater for a temporary refusal) naming
  // the ps, the op and its label when a reply is an error or a ps stays
  // silent. A ticket already waited for returns at once.
  std::vector<Reply> wait(Ticket ticket);
  // Whether every reply of `ticket` is in (wait() would not block).
  bool answered(Ticket ticket) const;
  // Serves replies and resends for up to `timeout`.
  void poll(Clock::duration timeout);

  // While a Batch lives, the requests sent on its channel wait; when it
  // ends (or the channel polls), those to each ps leave together in
  // messages (shared/protocol.h), which the ps answers likewise: a call's
  // small chunks to one ps cost one wake-up of each side's threads instead
  // of one per chunk. A message holds requests of at most kMaxBatchBytes
  // together, and at most wire::kMaxRequestsPerMessage (one of the default
  // 256 KiB chunks travels alone), so that large calls still stream:
  // measured on loopback, one message per large call slowed pulls by a
  // quarter and the MLP's step by a tenth. Resends leave alone. A Batch
  // left by an exception drops its requests unsent.
  class Batch {
   public:
    explicit Batch(PsChannel& channel);
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    PsChannel& channel_;
    int exceptions_;  // std::uncaught_exceptions() when it began
  };
  // Sends a control request to each of `servers` and waits for the replies.
  std::vector<Reply> call(wire::Op op, const std::vector<std::uint32_t>& servers, wire::Header h,
                          double timeout_s, std::span<const std::uint8_t> bytes = {});
  // The servers still serving their own shard (all but those failed over).
  std::vector<std::uint32_t> all_servers() const;
  // The ps serving ps `server`'s shard: itself, or its backup after a
  // fail-over.
  std::uint32_t serving(std::uint32_t server) const { return serving_.at(server); }
  // Sends ps `server`'s requests to its backup from here on, as a fail-over
  // does, or (`to_backup` false) to the ps itself again: a new worker's
  // hello finds out which serves the shard (its backup may have taken it
  // over before this process started). Requests in flight to the other
  // are not moved: call it between calls.
  void route(std::uint32_t server, bool to_backup);
  // Gives up on every ticket without waiting for its replies, for a caller
  // leaving on an error: replies still to come are ignored, the sockets of
  // servers still holding zero-copy frames are replaced (which makes ZeroMQ
  // drop them), and it returns once ZeroMQ has released every frame, within
  // timeout_s.
  void abandon_all();

  // The generation ps `server`'s replies carry: the first reply's, or the
  // latest after a change; 0 before any reply.
  std::uint64_t generation(std::uint32_t server) const { return generations_.at(server); }
  // Whether ps `server`'s generation changed since the previous call (the
  // first reply's generation is not a change): true once per change.
  bool take_generation_change(std::uint32_t server);
  // Updates (push, push_pull, assign requests) ps `server` acknowledged.
  std::uint64_t acked_updates(std::uint32_t server) const { return acked_.at(server); }

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

 private:
  struct TicketState;
  struct Request;
  // A socket for ps `server`'s requests, to the ps serving its shard (or to
  // `to`), named wire::failover_peer(server) when that is another ps.
  std::unique_ptr<zmq::socket_t> make_socket(std::uint32_t server);
  std::unique_ptr<zmq::socket_t> make_socket(std::uint32_t server, std::uint32_t to);
  // `to`: a socket other than r.server's (the backup on trial); only for
  // sends that copy.
  void transmit(const Request& r, std::span<const std::uint8_t> bytes, bool zero_copy,
                zmq::socket_t* to = nullptr);
  zmq::message_t payload_frame(std::uint32_t server, std::span<const std::uint8_t> frame,
                               bool zero_copy);
  static void send_frames(zmq::socket_t& socket, std::vector<zmq::message_t>& frames);
  // Fail-over: starts sending ps `server`'s requests to its backup too; its
  // backup answered, so the shard moves there.
  void try_backup(std::uint32_t server);
  Clock::duration trial_interval() const;
  void fail_over(std::uint32_t server);
  void send_batch(std::uint32_t server);
  void send_batches();
  void resend_due();
  Clock::time_point next_resend() const;
  std::vector<Reply> finish(Ticket id, TicketState& t);
  bool frames_released() const;
  void wait_for_releases(Clock::time_point deadline);
  void replace_socket(std::uint32_t server);
  [[noreturn]] void timed_out(Ticket id, TicketState& t);
  // A received message: each reply in it to dispatch().
  // `trial`: from the socket trying server's backup.
  // `messages`: the frames' messages, which a handler may take.
  void dispatch_message(std::uint32_t server, bool trial,
                        std::span<const std::span<const std::uint8_t>> frames,
                        std::span<zmq::message_t> messages);
  // A backup's message on trial: nullopt when it holds an ok reply, else
  // why it refuses (its first error's text).
  static std::optional<std::string> trial_refusal(
      std::span<const std::span<const std::uint8_t>> frames);
  // `payload_message`: the message of the only payload frame (null when
  // there is not exactly one), which a handler may take.
  void dispatch(std::uint32_t server, wire::Header h,
                std::span<const std::span<const std::uint8_t>> payloads,
                zmq::message_t* payload_message);
  void note_generation(std::uint32_t server, std::uint64_t generation);

  std::vector<std::string> addresses_;
  std::uint64_t run_id_;
  PsClientOptions options_;
  // Zero-copy frames ZeroMQ has not released yet, per ps, over all tickets:
  // decremented from ZeroMQ's I/O thread, hence atomic. They belong to the
  // channel rather than a ticket, whose state may be gone by the time the
  // I/O thread notifies; declared before the context, which releases the
  // last frames when it terminates.
  std::vector<std::atomic<std::uint64_t>> frames_held_;
  std::unordered_map<Ticket, std::unique_ptr<TicketState>> tickets_;
  std::unordered_map<std::uint64_t, Request> requests_;  // by request id
  std::vector<std::uint64_t> generations_;               // per ps: the latest its replies carried
  std::vector<bool> generation_changed_;                 // per ps: since take_generation_change
  std::vector<Clock::time_point> last_heard_;            // per ps: its latest reply (resend_due)
  std::vector<std::uint64_t> acked_;                     // per ps: acknowledged updates
  std::uint64_t incarnation_;
  FaultInjector faults_;
  Ticket next_ticket_ = 1;
  std::unique_ptr<zmq::context_t> context_;
  std::vector<std::unique_ptr<zmq::socket_t>> sockets_;  // per shard's ps: where its requests go
  // Fail-over: per ps, who serves its shard, and the socket trying its
  // backup while it is silent (null otherwise).
  std::vector<std::uint32_t> serving_;
  std::vector<std::unique_ptr<zmq::socket_t>> trials_;
  // While a Batch lives: the frames of the requests sent meanwhile, per ps,
  // their bytes and their number; a batch that would pass kMaxBatchBytes or
  // wire::kMaxRequestsPerMessage leaves first.
  static constexpr std::size_t kMaxBatchBytes = 256 * 1024;
  bool batching_ = false;
  std::vector<std::vector<zmq::message_t>> batched_;
  std::vector<std::size_t> batched_bytes_;
  std::vector<std::size_t> batched_requests_;
  // An unbatched send's frames, kept between sends so that a send (a
  // resend, a heartbeat) allocates no vector; empty between sends.
  std::vector<zmq::message_t> unbatched_;
};

}  // namespace pstrain
