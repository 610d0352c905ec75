#include "server/dispatcher.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>
#include <vector>

#include "server/consistency/policy.h"
#include "server/shard_state.h"
#include "shared/config.h"
#include "shared/init.h"
#include "shared/log.h"
#include "shared/messages.h"
#include "shared/trace.h"

namespace pstrain::ps {
namespace {

using wire::Header;
using wire::Op;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// "pull of 'w' chunk 3", "barrier 'start'": what an error reply is about.
std::string describe(const Header& request) {
  std::string s(wire::to_string(request.op));
  switch (request.op) {
    case Op::init:
    case Op::pull:
    case Op::push:
    case Op::push_pull:
    case Op::assign: {
      const auto id = wire::ChunkRequest::read(request);
      return s + " of '" + id.variable + "' chunk " + std::to_string(id.chunk);
    }
    default:
      return request.name.empty() ? s : s + " '" + request.name + "'";
  }
}

Header bad_header_reply(std::string text) {
  Header h;
  h.status = wire::Status::error;
  h.text = std::move(text);
  return h;
}

}  // namespace

Dispatcher::Dispatcher(DispatcherOptions options, PsStats& stats, ReplySink& wire)
    : options_(std::move(options)), stats_(stats), wire_(wire) {}

std::string Dispatcher::prefix() const { return "ps " + std::to_string(options_.ps_index) + ": "; }

void Dispatcher::handle(Coordinator& coordinator, std::span<const Frame> frames,
                        Clock::time_point received, const Connection& connection) {
  const auto bytes_of = [](std::span<const Frame> part) {
    std::size_t bytes = 0;
    for (const auto& frame : part) bytes += frame.size();
    return bytes;
  };
  stats_.message();
  if (frames.empty()) {  // no sender to answer
    stats_.received(std::nullopt, 0);
    return stats_.malformed();
  }
  const Peer from(frames[0].begin(), frames[0].end());
  if (frames.size() < 2) {
    stats_.received(std::nullopt, bytes_of(frames));
    stats_.malformed();
    return send(from, {bad_header_reply("message has no header frame"), {}});
  }
  // The message's requests, each a header and the payload frames it
  // declares (shared/protocol.h), all found before any is handled: a
  // message whose frames do not cut into requests is refused whole, with
  // nothing applied.
  std::vector<std::pair<std::size_t, Header>> parts;  // (header frame, header)
  for (std::size_t at = 1; at < frames.size();) {
    try {
      parts.emplace_back(at, wire::decode_header(frames[at]));
    } catch (const wire::ProtocolError& e) {
      stats_.received(std::nullopt, bytes_of(frames));
      stats_.malformed();
      if (parts.empty())
        return send(from, {bad_header_reply(std::string("bad header: ") + e.what()), {}});
      const Header& first = parts.front().second;
      return send(from,
                  {wire::error_reply(first, prefix() + describe(first) + ": header declares " +
                                                std::to_string(first.payload_frames) +
                                                " payload frames, the message has " +
                                                std::to_string(frames.size() - 2) +
                                                " frames after it that are not all "
                                                "requests (bad header at frame " +
                                                std::to_string(at) + ": " + e.what() + ")"),
                   {}});
    }
    at += 1 + parts.back().second.payload_frames;
    if (parts.size() == wire::kMaxRequestsPerMessage && at < frames.size()) {
      stats_.received(std::nullopt, bytes_of(frames));
      stats_.malformed();
      const Header& first = parts.front().second;
      return send(from, {wire::error_reply(first, prefix() + describe(first) +
                                                      ": the message holds more than " +
                                                      std::to_string(wire::kMaxRequestsPerMessage) +
                                                      " requests; none was handled"),
                         {}});
    }
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0 && coordinator.exit_code()) return;  // a request before it ended the ps
    const std::size_t at = parts[i].first;
    const std::size_t end = i + 1 < parts.size() ? parts[i + 1].first : frames.size();
    Request request;
    request.from = from;
    request.received = received;
    request.header = std::move(parts[i].second);
    // The last request may lack frames it declares; check() says so.
    const auto payloads = frames.subspan(at + 1, end - at - 1);
    // The sender's identity counts with the first request.
    stats_.received(request.header.op,
                    (i == 0 ? frames[0].size() : 0) + frames[at].size() + bytes_of(payloads));
    stats_.request(request.header.op);
    {
      const TraceSpan span(wire::to_string(request.header.op), "ps");
      recording_frames_ = frames.subspan(at, end - at);
      serve(coordinator, request, payloads, connection);
    }
    stats_.handled(request.header.op,
                   std::chrono::duration<double>(Clock::now() - received).count());
  }
}

void Dispatcher::refuse(const Request& request, std::string text) {
  stats_.error();
  send(request.from, {wire::error_reply(request.header, std::move(text)), {}});
}

void Dispatcher::serve(Coordinator& coordinator, Request& request, std::span<const Frame> payloads,
                       const Connection& connection) {
  try {
    dispatch(coordinator, request, payloads, connection);
  } catch (const std::exception& e) {
    recording_ = nullptr;
    stats_.error();
    send(request.from,
         {wire::error_reply(request.header, prefix() + describe(request.header) + ": " + e.what()),
          {}});
  }
}

void Dispatcher::resume(Coordinator& coordinator, Clock::time_point now) {
  if (parked_hellos_.empty() || !replicator_ || !replicator_->serving(now)) return;
  auto parked = std::exchange(parked_hellos_, {});
  for (auto& [request, connection] : parked) {
    // Its sender has asked the backup since (client/ps/control_client.h).
    if (now - request.received >= options_.backup_silence) continue;
    recording_frames_ = {};
    serve(coordinator, request, {}, connection);
  }
}

void Dispatcher::dispatch(Coordinator& coordinator, Request& request,
                          std::span<const Frame> payloads, const Connection& connection) {
  check(request.header, payloads);
  check_run(request.header);
  if (request.header.payload_frames >= 1) request.payload = payloads[0];
  if (request.header.payload_frames == 2) request.rows = payloads[1];
  const bool forward = forwarded(request.from);
  const bool failover = !forward && failing_over(request.from);
  if (options_.rights) {
    if (const auto why = refusal_of(connection, request.header, forward)) {
      stats_.refused();
      return refuse(request, prefix() + "refused: " + *why);
    }
  }
  if (forward && heard_primary(request)) return;
  // Unanswered, as by a dead ps: the worker's resends find the ps that may
  // serve it (server/replicator.h, "Fail-over and the lease").
  if (failover && moved_back(request)) return;
  if (failover && !take_over(request)) return stats_.unserved();
  // Forwards and fail-over requests both work on the copy of the
  // primary's shard.
  const bool on_copy = forward || (failover && request.header.op != Op::hello);
  // The shard's values, read or written, only under the lease (a snapshot
  // of a primary continued after a stop would save a stale shard); and the
  // hello, whose reply says how many updates the shard holds (a restarted
  // ps holds them once its backup handed the shard back).
  const Op op = request.header.op;
  if (!on_copy && replicator_ && (wire::is_data_op(op) || op == Op::snapshot || op == Op::hello) &&
      !replicator_->serving(Clock::now())) {
    // A hello waits for the lease (resume()): hellos are not resent, and
    // a restarted ps must not say it holds nothing before its backup
    // handed its shard back.
    if (op != Op::hello) return stats_.unserved();
    if (parked_hellos_.size() == kMaxParkedHellos) parked_hellos_.pop_front();
    parked_hellos_.push_back({request, connection});
    return;
  }
  if (!on_copy && !coordinator.admit(request)) return stats_.error();
  const Handlers& handlers = on_copy ? replica_handlers_ : handlers_;
  const Handler* handler = handlers.find(request.header.op);
  if (!handler)
    throw wire::ProtocolError(on_copy ? "this ps does not serve the op on a shard's copy"
                                      : "this ps does not serve the op");
  if (request.header.op == Op::hello) dedup_.hello(request.header);
  // Forwards have a record of their own: a worker's hello here (it
  // restarted) must not forget the updates its primary still forwards.
  Dedup& dedup = on_copy ? replica_dedup_ : dedup_;
  const auto seen = dedup.find(request.header);
  if (seen.verdict == Dedup::Verdict::resent) {
    // Its reply still waits for the backup: it goes to the resend's sender then.
    if (!on_copy && replicator_ && replicator_->held(request.header, request.from))
      return stats_.resend_answered();
    return answer_resend(handlers, request, seen.version);
  }
  if (seen.verdict == Dedup::Verdict::too_old) {
    stats_.too_old();
    throw std::runtime_error("request id " + std::to_string(request.header.request_id) +
                             " is older than the last " + std::to_string(Dedup::kWindow) +
                             " this ps recorded for the sender; it may have been applied "
                             "already, so it is not applied again");
  }
  recording_ = &request.header;
  recording_from_ = &request.from;
  recording_forward_ = on_copy;
  // An update of this ps's own shard goes to the backup first, which applies
  // it while this ps does; its reply waits for both (send()). The copy's
  // updates, taken over, have no backup.
  const bool replicate = replicator_ && !on_copy && Dedup::recorded(request.header.op);
  if (replicate) replicator_->forward(recording_frames_, request.header);
  try {
    (*handler)(request);
  } catch (const CopyMissesUpdates& e) {
    // Its primary gives it up on this refusal; until it has said so, the
    // copy must not be taken over with what it is known to miss.
    if (forward && !copy_given_up_) {
      copy_given_up_ = true;
      log(prefix(), "this copy of ps ", *options_.replica_of, "'s shard misses updates (", e.what(),
          "); it will not be taken over");
    }
    throw;
  } catch (...) {
    if (replicate) replicator_->settle(request.header, /*failed=*/true);
    throw;
  }
  if (replicate) replicator_->settle(request.header);
  recording_ = nullptr;
}

bool Dispatcher::forwarded(const Peer& from) const {
  return names_copy(from, Replicator::kPeerPrefix, "forwards");
}

bool Dispatcher::failing_over(const Peer& from) const {
  return names_copy(from, wire::kFailoverPeerPrefix, "requests for another ps's shard");
}

bool Dispatcher::names_copy(const Peer& from, std::string_view prefix,
                            const std::string& what) const {
  if (!from.starts_with(prefix)) return false;
  if (options_.replica_of &&
      from.starts_with(std::string(prefix) + std::to_string(*options_.replica_of) + "/"))
    return true;
  throw std::runtime_error(
      what + " from '" + from + "' are not served here: this ps keeps " +
      (options_.replica_of
           ? "the copy of ps " + std::to_string(*options_.replica_of) + "'s shard only"
           : std::string("no shard's copy")));
}

void Dispatcher::watch(Clock::time_point now) {
  if (now - last_watch_ > options_.backup_silence / 4)
    primary_heard_ = std::max(primary_heard_, now);
  last_watch_ = now;
}

bool Dispatcher::heard_primary(const Request& request) {
  const auto primary = std::to_string(*options_.replica_of);
  const Op op = request.header.op;
  const bool ping = op == Op::heartbeat;
  const bool writes = ping || op == Op::init || op == Op::step || wire::is_update(op);
  // A ping with the shard's state replaces the copy, whoever of the
  // primary's processes sends it (only the primary's key may, under CURVE).
  const bool resync = ping && request.header.operand == Replicator::kResync && !took_over_;
  // A process of the primary replaced by a newer one: a message of it still
  // queued changes nothing.
  if (std::ranges::find(superseded_, request.from) != superseded_.end()) {
    refuse(request, prefix() + "a newer process of ps " + primary + " replaced this one");
    return true;
  }
  // The new process serves (it no longer joins): its hand-back's cut goes.
  if (handback_ && request.from == handback_to_ &&
      !(ping && request.header.operand == Replicator::kJoining))
    handback_.reset();
  // The hand-back to this process got lost (its answer dropped or too
  // late), or it asks for the next piece: it asks again while joining.
  if (ping && handed_back_ && !took_over_ && request.from == primary_peer_ &&
      request.header.operand == Replicator::kJoining) {
    if (hand_back(request)) return true;
    // A plain answer would tell it there is nothing to hand back: this ps
    // serves the shard instead (the new process is fenced below).
    took_over_ = true;
    stats_.took_over();
    log(prefix(), "takes over ps ", primary, "'s shard again: its new process cannot get it");
  }
  // A new process of the primary (its replicator's identity is new at every
  // start) restored at best a checkpoint older than this copy: it gets the
  // copy (hand_back), or where that cannot be, the copy serves the shard.
  // A copy given up misses updates: the new process must serve alone until
  // it copies its shard here.
  if (primary_seen_ && writes && !resync && request.from != primary_peer_) {
    if (copy_given_up_) {
      refuse(request, prefix() + "this copy of ps " + primary +
                          "'s shard was given up and misses updates; the new process serves "
                          "alone until it copied its shard here");
      return true;
    }
    if (ping && hand_back(request)) return true;
    if (!took_over_) {
      took_over_ = true;
      stats_.took_over();
      log(prefix(), "takes over ps ", primary, "'s shard: a new process of ps ", primary,
          " speaks, and this copy holds every update "
          "it acknowledged; serving it from the copy, without a backup");
    }
  }
  if (took_over_) {
    refuse(request, std::string(Replicator::kTakenOver) + "ps " +
                        std::to_string(options_.ps_index) + " serves ps " + primary +
                        "'s shard from its copy");
    return true;
  }
  primary_heard_ = std::max(primary_heard_, request.received);
  if (writes) {
    primary_seen_ = true;
    set_primary(request.from);
  }
  if (!ping) return false;
  if (resync) {
    adopt_copy(request);
    return true;
  }
  if (request.header.operand == Replicator::kGivenUp && !copy_given_up_) {
    copy_given_up_ = true;
    log(prefix(), "ps ", primary,
        " serves on without this copy of its shard; it will not be taken over");
  }
  send(request.from, {wire::reply_to(request.header), {}});
  return true;
}

void Dispatcher::set_shards(ShardAccess own, ShardAccess copy) {
  own_ = std::move(own);
  copy_ = std::move(copy);
}

std::vector<std::uint8_t> Dispatcher::own_state() const {
  return encode_shard_state(own_->chunks(), own_->tables, own_->clocks(), dedup_);
}

void Dispatcher::adopt_own_state(std::span<const std::uint8_t> bytes) {
  auto state = decode_shard_state(bytes);
  // The record first: it changes nothing unless it fits; a shard that does
  // not fit then fences this ps (Replicator::adopt), which serves nothing.
  dedup_.restore(state.record);
  own_->replace(std::move(state));
}

void Dispatcher::set_primary(const Peer& peer) {
  if (peer == primary_peer_) return;
  copy_pieces_.clear();  // an earlier process's copy, unfinished
  if (!primary_peer_.empty()) {
    if (superseded_.size() == kMaxSuperseded) superseded_.pop_front();
    superseded_.push_back(primary_peer_);
  }
  primary_peer_ = peer;
}

bool Dispatcher::hand_back(const Request& request) {
  if (!copy_) return false;
  const auto primary = std::to_string(*options_.replica_of);
  // Cut once per new process; a piece asked again (its answer lost) comes
  // from that cut.
  if (!handback_ || handback_to_ != request.from) {
    const auto chunks = copy_->chunks();
    handback_chunks_ = chunks.size();
    try {
      handback_ = std::make_shared<const std::vector<std::uint8_t>>(
          encode_shard_state(chunks, copy_->tables, copy_->clocks(), replica_dedup_));
    } catch (const ShardStateError& e) {
      log(prefix(), "cannot hand ps ", primary, "'s shard back to its new process: ", e.what());
      return false;
    }
    handback_to_ = request.from;
    handback_id_ = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  }
  const auto pieces = state_pieces(handback_->size());
  std::uint64_t asked = wire::ShardPiece::read(request.header).index;
  if (asked >= pieces) asked = 0;  // of an earlier cut: from the start
  Reply reply{wire::reply_to(request.header), {}};
  reply.header.operand = handback_id_;
  wire::ShardPiece{static_cast<std::uint32_t>(asked), handback_->size()}.write(reply.header);
  const auto piece = state_piece(*handback_, asked);
  reply.payload = std::make_shared<const std::vector<std::uint8_t>>(piece.begin(), piece.end());
  send(request.from, std::move(reply));
  // The new process is heard while it fetches: its shard is not taken over
  // meanwhile, however long the pieces take.
  primary_heard_ = std::max(primary_heard_, request.received);
  if (asked > 0 || (handed_back_ && !took_over_ && request.from == primary_peer_)) return true;
  const auto bytes = handback_->size();
  stats_.handed_back();
  std::uint64_t rows = 0;
  if (copy_->tables)
    for (const auto& h : copy_->tables->headers()) rows += copy_->tables->rows(h.name);
  log(prefix(), "hands ps ", primary, "'s shard (", handback_chunks_, " chunks, ", rows,
      " table rows, ", bytes, " bytes in ", pieces, pieces == 1 ? " message" : " messages",
      ") back to a new process of ps ", primary,
      took_over_ ? ", which serves it again instead of this ps"
                 : ", which serves it with this copy's updates",
      "; this ps keeps the copy");
  took_over_ = false;
  handed_back_ = true;
  set_primary(request.from);
  primary_heard_ = std::max(primary_heard_, request.received);
  return true;
}

void Dispatcher::adopt_copy(const Request& request) {
  const auto primary = std::to_string(*options_.replica_of);
  if (!copy_) throw std::runtime_error("this ps keeps no copy it could replace");
  // The pieces of one copy share its ping's request id; answered once whole.
  const auto piece = wire::ShardPiece::read(request.header);
  if (!copy_pieces_.add(request.header.request_id, piece.index, piece.total, request.payload) ||
      !copy_pieces_.complete())
    return;
  auto state = decode_shard_state(copy_pieces_.take());
  const auto chunks = state.chunks.size();
  const auto rows = state.rows();
  const auto updates = state.updates();
  replica_dedup_.restore(state.record);
  copy_->replace(std::move(state));
  copy_given_up_ = false;
  stats_.rejoined();
  log(prefix(), "keeps the copy of ps ", primary, "'s shard again: ", chunks, " chunks and ", rows,
      " table rows (", updates,
      " updates) copied from it; its updates are forwarded here from now on");
  send(request.from, {wire::reply_to(request.header), {}});
}

bool Dispatcher::moved_back(const Request& request) {
  if (!handed_back_ || took_over_ || !wire::is_data_op(request.header.op) ||
      Clock::now() - primary_heard_ >= options_.backup_silence)
    return false;
  refuse(request, std::string(wire::kMovedBack) + "ps " + std::to_string(*options_.replica_of) +
                      " serves its shard again");
  return true;
}

bool Dispatcher::take_over(const Request& request) {
  const auto primary = std::to_string(*options_.replica_of);
  // And, once taken over, its end-of-run snapshot (worker 0 asks every ps)
  // and the hello of a worker started since (answered by this ps's own
  // coordinator: the worker is this ps's too); before, they go unanswered,
  // so that a worker asks the primary again.
  if (request.header.op == Op::snapshot || request.header.op == Op::hello) return took_over_;
  if (!wire::is_data_op(request.header.op))
    throw wire::ProtocolError(
        "only data requests for ps " + primary +
        "'s chunks and rows, its snapshot and hello once taken over, are served on "
        "a fail-over connection");
  if (took_over_) return true;
  if (copy_given_up_)
    throw std::runtime_error("cannot serve ps " + primary + "'s shard: ps " + primary +
                             " gave up this copy (it misses updates since)");
  const auto silent = std::chrono::duration<double>(Clock::now() - primary_heard_).count();
  // Judged now, and only while this loop runs on time: a pass long enough
  // for the primary to seem silent may have kept its messages unread.
  const auto now = Clock::now();
  if (!primary_seen_ || now - primary_heard_ < options_.backup_silence ||
      now - last_watch_ > options_.backup_silence / 4) {
    if (!waiting_logged_)
      log(prefix(), "a worker asks for ps ", primary, "'s shard, which ",
          primary_seen_ ? "was heard " + std::to_string(silent) + " s ago"
                        : std::string("has not been heard yet"),
          "; not taking it over before it was silent for replication.backup_silence");
    waiting_logged_ = true;
    return false;
  }
  took_over_ = true;
  handback_.reset();  // a hand-back its new process did not finish
  stats_.took_over();
  log(prefix(), "takes over ps ", primary, "'s shard: heard nothing from it for ", silent,
      " s; serving it from the copy, without a backup");
  return true;
}

// A resend of an update this ps applied already (server/dedup.h says what it
// is answered with).
void Dispatcher::answer_resend(const Handlers& handlers, const Request& request,
                               std::uint64_t version) {
  stats_.resend_answered();
  if (request.header.op == Op::sparse_push_pull) {
    // The sparse pull handler answers its pull half: the ids without their
    // gradients (the op stays, so the reply carries it).
    Request as_pull = request;
    as_pull.header.payload_frames = 1;
    as_pull.rows = {};
    return (*handlers.find(Op::sparse_pull))(as_pull);
  }
  if (request.header.op != Op::push_pull) {
    Reply reply{wire::reply_to(request.header), {}};
    wire::ChunkReply{version}.write(reply.header);
    return send(request.from, std::move(reply));
  }
  // The pull handler answers its pull half: a push_pull without its
  // gradient (the op stays, so the reply carries it, and a ps in mode ssp
  // reads the clock as the pusher's next step's).
  Request as_pull = request;
  as_pull.header.payload_frames = 0;
  as_pull.header.elements = 0;
  as_pull.payload = {};
  // A compressed push's values came back as float32 the first time too.
  if (wire::is_compressed(as_pull.header.dtype)) as_pull.header.dtype = wire::DType::f32;
  (*handlers.find(Op::pull))(as_pull);
}

// What every request must satisfy before its handler sees it.
void Dispatcher::check(const Header& request, std::span<const Frame> payloads) const {
  if (request.protocol != wire::kProtocolVersion)
    throw wire::ProtocolError("protocol version differs: ps speaks " +
                              std::to_string(wire::kProtocolVersion) + ", sender " +
                              std::to_string(request.sender) + " speaks " +
                              std::to_string(request.protocol));
  if (payloads.size() != request.payload_frames)
    throw wire::ProtocolError("header declares " + std::to_string(request.payload_frames) +
                              " payload frames, the message has " +
                              std::to_string(payloads.size()));
  for (std::size_t i = 0; i < request.payload_frames; ++i)
    wire::check_payload(request, i, payloads[i].size());
}

std::optional<std::string> Dispatcher::refusal_of(const Connection& connection,
                                                  const Header& request, bool forward) {
  auto why = connection.identity ? refusal(*connection.identity, request, *options_.rights, forward)
                                 : std::optional<std::string>("the connection has no identity");
  if (why && rights_refusals_logged_.size() < kMaxRightsRefusalsLogged) {
    const std::string address = connection.address.empty() ? "?" : connection.address;
    if (rights_refusals_logged_.emplace(address, request.op).second)
      log(prefix(), "refused ", wire::to_string(request.op), " from ", address, ": ", *why);
  }
  return why;
}

// A request of another run is refused with what kind of mismatch it is;
// the values go to our log only (dispatcher.h).
void Dispatcher::check_run(const Header& request) {
  if (request.run_id == options_.run_id) return;
  std::string reply, logged;
  const auto hello = request.op == Op::hello ? wire::Hello::read(request).config_yaml : "";
  if (hello.empty()) {
    reply = "run id differs: the sender belongs to another launch or uses a different config";
    logged = "sent run id " + hex(request.run_id) + ", this run's is " + hex(options_.run_id);
  } else if (fnv1a64(hello) == options_.config_hash) {
    reply =
        "run id differs: the sender is a process of another launch of this config (a "
        "stale process of an earlier run, or one started without this launch's --run-id); "
        "it is not part of this run";
    logged = "same config, run id " + hex(request.run_id) + " of another launch (this one's is " +
             hex(options_.run_id) + ")";
  } else {
    reply = "config differs in: " + config_difference_keys(options_.config_yaml, hello) +
            " — all processes must use the same cluster.yaml and --set overrides";
    logged =
        "config differs (ps vs sender: " + config_differences(options_.config_yaml, hello) + ")";
  }
  if (refusals_logged_ < kMaxLoggedRefusals)
    log(prefix(), "refused ", describe(request), " from sender ", request.sender, ": ", logged,
        ++refusals_logged_ == kMaxLoggedRefusals
            ? "; further refusals of other runs are not logged (stats: errors)"
            : "");
  throw wire::ProtocolError(reply);
}

void Dispatcher::send(const Peer& to, Reply reply) {
  const Header& h = reply.header;
  if (recording_ && h.status == wire::Status::ok && h.request_id == recording_->request_id &&
      to == *recording_from_) {
    const Header& request = *recording_;
    accepted(request, h.version);
    // An update of this ps's own shard is acknowledged once the backup has it.
    if (replicator_ && !recording_forward_ && replicator_->hold(request, to, reply)) return;
  } else if (replicator_ && h.status == wire::Status::ok && wire::is_update(h.op) &&
             replicator_->hold(h, to, reply, /*deferred_only=*/true)) {
    // The reply to an update applied earlier that the mode held (deferred
    // in accepted()): it waits for the backup too. The reply carries the
    // request's id and incarnation (wire::reply_to), which key the forward.
    return;
  }
  wire_.send(to, std::move(reply));
}

void Dispatcher::applied_step(const wire::StepRequest& step, std::span<const float> mean,
                              std::span<const Request> contributors) {
  if (replicator_) replicator_->forward_step(step, mean, contributors);
}

void Dispatcher::accepted(const Header& request, std::uint64_t version) {
  if (recording_ != &request) return;
  (recording_forward_ ? replica_dedup_ : dedup_).record(request, version);
  // Whether the reply comes now (through send()) or later (a handler that
  // holds it, mode ssp, calls this itself), it waits for the forward.
  if (replicator_ && !recording_forward_) replicator_->defer(request);
  recording_ = nullptr;  // recorded once; the held reply, when sent, is not
}

}  // namespace pstrain::ps
