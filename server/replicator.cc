#include "server/replicator.h"

#include <cstdio>
#include <iterator>
#include <random>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "shared/log.h"
#include "shared/messages.h"
#include "shared/tsan.h"

namespace pstrain::ps {

namespace {

using SharedFrame = std::shared_ptr<const std::vector<std::uint8_t>>;

// A frame ZeroMQ sends from `bytes` without a copy, holding a reference
// until its I/O thread has sent it: a forward sent again while the first
// send is still queued shares the bytes. (The reference crosses to that
// thread inside libzmq: shared/tsan.h.)
// `part`: the bytes of it the frame holds (a piece of a shard's state).
zmq::message_t shared_frame(const SharedFrame& bytes, std::span<const std::uint8_t> part = {}) {
  if (part.empty()) part = *bytes;
  auto keep = std::make_unique<SharedFrame>(bytes);
  tsan::handed_over(keep.get());
  zmq::message_t msg(
      const_cast<std::uint8_t*>(part.data()), part.size(),
      [](void*, void* hint) {
        tsan::taken_over(hint);
        std::unique_ptr<SharedFrame> owned(static_cast<SharedFrame*>(hint));
      },
      keep.get());
  keep.release();  // the message's free function owns it from here
  return msg;
}

}  // namespace

struct Replicator::Held {
  std::vector<SharedFrame> frames;  // the forward, as the worker sent it
  Peer to;
  std::optional<Reply> reply;  // once this ps has handled the request
  bool acked = false;          // the backup answered before that
  bool deferred = false;       // accepted, its reply held by the mode (ssp) for later
  // Mode backup: the request id of the step forward this reply also waits
  // for (0: none), its step's; and on a step's forward, those replies.
  std::uint64_t after_step = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> waiters;
  Clock::time_point forwarded{};  // first sent
  Clock::time_point resend_at{};
  Clock::duration interval{};  // until the next resend; doubles
};

std::string Replicator::peer_of(std::uint32_t primary) {
  return std::string(kPeerPrefix) + std::to_string(primary) + "/";
}

Replicator::Replicator(zmq::context_t& context, ReplicatorOptions options, PsStats& stats,
                       ReplySink& wire)
    : options_(std::move(options)),
      stats_(stats),
      wire_(wire),
      socket_(std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer)),
      last_heard_(Clock::now()),
      last_tick_(last_heard_) {
  socket_->set(zmq::sockopt::linger, 0);
  // Nothing queues for a backup not connected (down, restarting): its
  // forwards go out again at their resends, and pings to a lost backup do
  // not pile up.
  socket_->set(zmq::sockopt::immediate, true);
  socket_->set(zmq::sockopt::sndhwm, 0);
  socket_->set(zmq::sockopt::rcvhwm, 0);
  socket_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(wire::kMaxFrameBytes));
  std::random_device random;
  socket_->set(
      zmq::sockopt::routing_id,
      peer_of(options_.ps_index) + std::to_string(std::uint64_t{random()} << 32 | random()));
  step_incarnation_ = (std::uint64_t{random()} << 32 | random()) | 1;
  if (options_.curve) {
    socket_->set(zmq::sockopt::curve_serverkey, options_.curve->second);
    socket_->set(zmq::sockopt::curve_publickey, options_.curve->first.public_key);
    socket_->set(zmq::sockopt::curve_secretkey, options_.curve->first.secret_key);
  }
  socket_->connect(options_.backup_address);
}

Replicator::~Replicator() = default;

void Replicator::forward(std::span<const std::span<const std::uint8_t>> frames,
                         const wire::Header& request) {
  if (!active_) return;
  // One copy: the received frames are gone once the request is handled.
  std::vector<SharedFrame> copies;
  for (const auto& f : frames)
    copies.push_back(std::make_shared<const std::vector<std::uint8_t>>(f.begin(), f.end()));
  // Every forward at one priority: the backup serves requests of one
  // priority in their order of arrival (server/request_loop.h). A push_pull
  // goes as a push (a sparse one as a sparse push): the backup acknowledges
  // it without the values, which only the worker reads (from here).
  wire::Header forwarded = request;
  forwarded.priority = 0;
  if (forwarded.op == wire::Op::push_pull) forwarded.op = wire::Op::push;
  if (forwarded.op == wire::Op::sparse_push_pull) forwarded.op = wire::Op::sparse_push;
  copies.front() =
      std::make_shared<const std::vector<std::uint8_t>>(wire::encode_header(forwarded));
  Held held = send_held(std::move(copies));
  if (request.incarnation == 0) return;
  // A request is forwarded once: the dispatcher answers a resend of one
  // whose reply is held through held() before any handler.
  held_.insert_or_assign({request.incarnation, request.request_id}, std::move(held));
  count_pending();
}

bool Replicator::hold(const wire::Header& request, const Peer& to, Reply& reply,
                      bool deferred_only) {
  const auto it = held_.find({request.incarnation, request.request_id});
  if (it == held_.end() || (deferred_only && !it->second.deferred)) return false;
  // A resend that came while a deferred reply waited named where it goes.
  if (it->second.to.empty()) it->second.to = to;
  it->second.reply = std::move(reply);
  if (it->second.acked && it->second.after_step == 0) {  // the backup was quicker
    release(it);
    count_pending();
  }
  return true;
}

void Replicator::forward_step(const wire::StepRequest& step, std::span<const float> mean,
                              std::span<const Request> contributors) {
  if (!active_) return;
  wire::Header h;
  h.op = wire::Op::step;
  h.sender = options_.ps_index;
  h.run_id = options_.run_id;
  h.incarnation = step_incarnation_;
  h.request_id = next_step_id_++;
  step.write(h);
  h.dtype = wire::DType::f32;
  h.payload_frames = 1;
  h.elements = mean.size();
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(mean.data());
  Held held = send_held(
      {std::make_shared<const std::vector<std::uint8_t>>(wire::encode_header(h)),
       std::make_shared<const std::vector<std::uint8_t>>(bytes, bytes + mean.size_bytes())});
  for (const auto& c : contributors) {
    const auto it = held_.find({c.header.incarnation, c.header.request_id});
    if (it == held_.end()) continue;
    it->second.after_step = h.request_id;
    held.waiters.push_back(it->first);
  }
  held_.emplace(Key{step_incarnation_, h.request_id}, std::move(held));
  count_pending();
}

void Replicator::step_answered(std::map<Key, Held>::iterator it) {
  const auto id = it->first.second;
  const auto waiters = std::move(it->second.waiters);
  held_.erase(it);
  for (const auto& key : waiters) {
    const auto w = held_.find(key);
    if (w == held_.end() || w->second.after_step != id) continue;
    w->second.after_step = 0;
    if (w->second.acked && w->second.reply) release(w);
  }
}

void Replicator::release(std::map<Key, Held>::iterator it) {
  wire_.send(it->second.to, std::move(*it->second.reply));
  held_.erase(it);
}

void Replicator::settle(const wire::Header& request, bool failed) {
  const auto it = held_.find({request.incarnation, request.request_id});
  if (it == held_.end() || it->second.reply || (it->second.deferred && !failed)) return;
  held_.erase(it);
  count_pending();
}

void Replicator::defer(const wire::Header& request) {
  const auto it = held_.find({request.incarnation, request.request_id});
  if (it != held_.end()) it->second.deferred = true;
}

bool Replicator::held(const wire::Header& request, const Peer& to) {
  const auto it = held_.find({request.incarnation, request.request_id});
  if (it == held_.end()) return false;
  it->second.to = to;  // a resend may come on a new connection
  return true;
}

Clock::duration Replicator::resend_interval() const {
  return std::min(options_.retry_interval, options_.backup_silence / 4);
}

Replicator::Held Replicator::send_held(std::vector<SharedFrame> frames) {
  const auto now = Clock::now();
  Held held;
  held.frames = std::move(frames);
  held.forwarded = now;
  held.interval = resend_interval();
  held.resend_at = now + held.interval;
  stats_.replica_forwarded();
  send(held);
  return held;
}

void Replicator::send(const Held& held) {
  for (std::size_t i = 0; i < held.frames.size(); ++i) {
    const auto more = i + 1 < held.frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    // Never blocks (no high-water mark); a forward the socket does not take
    // goes out again at its resend.
    if (!socket_->send(shared_frame(held.frames[i]), more | zmq::send_flags::dontwait)) return;
  }
}

void Replicator::receive(Clock::time_point now) {
  std::vector<zmq::message_t> frames;
  while (zmq::recv_multipart(*socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
    last_heard_ = now;
    backup_seen_ = true;
    // The answers in a message, each a header and its payload frames
    // (shared/protocol.h); only the headers matter here.
    for (std::size_t at = 0; at < frames.size() && !fenced_;) {
      wire::Header h;
      try {
        h = wire::decode_header({frames[at].data<std::uint8_t>(), frames[at].size()});
      } catch (const wire::ProtocolError& e) {
        give_up(std::string("its answer does not decode: ") + e.what());
        break;
      }
      const std::size_t header_at = at;
      at += 1 + h.payload_frames;
      answered_at_ = now;
      // A new process of the backup holds an empty copy: it is no backup;
      // one that answers while the backup is given up must be told so too.
      if (h.generation != 0 && backup_generation_ != 0 && h.generation != backup_generation_) {
        backup_generation_ = h.generation;
        if (!active_) {
          notice_due_ = true;
        } else {
          give_up("it restarted (a new process answers), so its copy misses this shard");
          break;
        }
      }
      if (h.generation != 0) backup_generation_ = h.generation;
      const bool error = h.status == wire::Status::error;
      if (error && h.text.starts_with(kTakenOver)) {
        fence(h.text);
        break;
      }
      if (h.op == wire::Op::heartbeat && h.incarnation == 0) {  // a ping's answer
        // The shard handed back to this new process, in the answer to a ping
        // sent while joining (even one given up on as too old): it serves
        // that. A second one (a stale answer) is not taken.
        const bool handed_back = !error && h.payload_frames == 1 && header_at + 1 < frames.size();
        if (handed_back && joining_) {
          const auto sent = pings_.find(h.request_id);
          take_piece(h, {frames[header_at + 1].data<std::uint8_t>(), frames[header_at + 1].size()},
                     sent == pings_.end() ? now : sent->second.sent, now);
          if (fenced_) break;
        }
        const auto it = pings_.find(h.request_id);
        if (it == pings_.end()) continue;
        const Ping ping = it->second;
        pings_.erase(pings_.begin(), std::next(it));  // older ones are answered by this
        if (error) {
          // Refusing the notice that it is given up says as much.
          if (!active_) notice_due_ = false;
          give_up(std::string(ping.operand == kResync ? "it refused this shard's copy: "
                                                      : "it refused a ping: ") +
                  h.text);
          break;
        }
        // Answered in order: a later ping's answer before the copy's means
        // the copy was lost (the process that had it is gone).
        if (resync_id_ != 0 && h.request_id > resync_id_) {
          give_up("it answered a later ping but not this shard's copy");
          break;
        }
        if (ping.operand == kGivenUp) {
          notice_due_ = false;
          log("ps ", options_.ps_index, ": backup ps ", options_.backup_index,
              " was told it is given up");
        }
        if (ping.operand == kResync) {
          resync_id_ = 0;
          stats_.rejoin_took(std::chrono::duration<double>(now - ping.sent).count());
          log("ps ", options_.ps_index, ": backup ps ", options_.backup_index,
              " holds this shard's copy again (copied and answered in ",
              std::chrono::duration<double>(now - ping.sent).count(),
              " s); the shard has two copies from here on");
        }
        // Nothing handed back: the backup had no copy for this process (a
        // fresh start); it serves its own shard.
        if (ping.operand == kJoining && !handed_back) {
          joining_ = false;
          handback_.clear();
        }
        if (joining_) continue;  // no lease before the shard is settled
        renew(ping.sent);
        continue;
      }
      const auto it = held_.find({h.incarnation, h.request_id});
      if (it == held_.end()) continue;  // an answer to a forward sent again, or given up
      if (error) {
        give_up("it refused a forwarded " + std::string(wire::to_string(h.op)) + ": " + h.text);
        break;
      }
      renew(it->second.forwarded);
      if (it->second.acked) continue;  // a second answer, to a forward sent again
      stats_.replica_acked(std::chrono::duration<double>(now - it->second.forwarded).count());
      it->second.acked = true;
      if (it->first.first == step_incarnation_) {
        step_answered(it);
        continue;
      }
      // hold() sends it, or the answer to its step's forward.
      if (it->second.reply && it->second.after_step == 0) release(it);
    }
    frames.clear();
  }
  count_pending();
}

void Replicator::renew(Clock::time_point sent) {
  lease_until_ = std::max(lease_until_, sent + options_.backup_silence / 2);
}

void Replicator::ping(Clock::time_point now, bool next_piece) {
  wire::Header h;
  h.op = wire::Op::heartbeat;
  h.sender = options_.ps_index;
  h.run_id = options_.run_id;
  h.request_id = next_ping_id_++;
  h.operand = notice_due_ ? kGivenUp : joining_ ? kJoining : 0;
  if (h.operand == kJoining) {
    // Fetching a hand-back: each piece is asked for as the one before
    // arrives (take_piece); a ping asks again only when none came for a
    // while (its answer lost), so that the backup does not queue copies of
    // a piece still on its way.
    if (!next_piece && handback_.next() > 0 && now - last_piece_ < options_.backup_silence / 4) {
      next_ping_at_ = now + options_.backup_silence / 8;
      return;
    }
    last_piece_ = now;
    wire::ShardPiece{static_cast<std::uint32_t>(handback_.next()), 0}.write(h);
  }
  const auto header = wire::encode_header(h);
  pings_[h.request_id] = {now, h.operand};
  next_ping_at_ = now + options_.backup_silence / 8;
  zmq::message_t frame(header.data(), header.size());
  (void)socket_->send(frame, zmq::send_flags::dontwait);  // a ping not taken is not missed
}

void Replicator::tick(Clock::time_point now) {
  // Long since the last tick: this process was stopped or starved, and did
  // not hear the backup meanwhile because it did not listen.
  if (now - last_tick_ > options_.backup_silence / 4) last_heard_ = now;
  last_tick_ = now;
  if (fenced_) return;
  std::erase_if(pings_,
                [&](const auto& p) { return now - p.second.sent >= options_.backup_silence; });
  if (active_ && now - last_heard_ >= options_.backup_silence) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f",
                  std::chrono::duration<double>(now - last_heard_).count());
    // A backup that never answered may still be starting: this ps waits for
    // it (serving nothing meanwhile) rather than run unreplicated from the
    // start.
    if (backup_seen_)
      return give_up(std::string("nothing heard from it for ") + secs +
                     " s (pings and forwards unanswered)");
    if (!waiting_logged_)
      log("ps ", options_.ps_index, ": waiting for backup ps ", options_.backup_index, " (",
          options_.backup_address, ") to answer (", secs,
          " s so far); this ps serves its shard once it has");
    waiting_logged_ = true;
  }
  // Given up, the pings go on: they find the backup when it answers again.
  if (now >= next_ping_at_) ping(now);
  // It answered since the last copy (so a copy is not queued for a backup
  // that reads nothing), knows it was given up, and a copy is not retried
  // more often than every backup_silence.
  if (!active_ && !notice_due_ && cut_ && !cannot_resync_ && answered_at_ > resync_sent_ &&
      now - resync_sent_ >= options_.backup_silence)
    resync(now);
  for (auto& [key, held] : held_) {
    if (held.acked || held.resend_at > now) continue;
    send(held);
    held.interval = std::min(held.interval * 2, options_.backup_silence / 4);
    held.resend_at = now + held.interval;
  }
}

void Replicator::set_shard(std::function<std::vector<std::uint8_t>()> cut,
                           std::function<void(std::span<const std::uint8_t>)> adopt) {
  cut_ = std::move(cut);
  adopt_ = std::move(adopt);
}

void Replicator::resync(Clock::time_point now) {
  resync_sent_ = now;
  SharedFrame state;
  try {
    state = std::make_shared<const std::vector<std::uint8_t>>(cut_());
  } catch (const std::exception& e) {
    // Its size does not change: not tried again.
    log("ps ", options_.ps_index, ": cannot copy this shard to backup ps ", options_.backup_index,
        ": ", e.what(), "; it serves on with one copy");
    cannot_resync_ = true;
    return;
  }
  wire::Header h;
  h.op = wire::Op::heartbeat;
  h.sender = options_.ps_index;
  h.run_id = options_.run_id;
  h.request_id = next_ping_id_++;
  h.operand = kResync;
  h.payload_frames = 1;
  h.dtype = wire::DType::bytes;
  // In pieces, back to back on the connection; the backup answers once it
  // has them all. A piece the socket does not take leaves the copy
  // unfinished: it is tried again after backup_silence.
  const auto pieces = state_pieces(state->size());
  for (std::size_t i = 0; i < pieces; ++i) {
    const auto part = state_piece(*state, i);
    h.elements = part.size();
    wire::ShardPiece{static_cast<std::uint32_t>(i), state->size()}.write(h);
    const auto header = wire::encode_header(h);
    zmq::message_t head(header.data(), header.size());
    if (!socket_->send(head, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    (void)socket_->send(shared_frame(state, part), zmq::send_flags::dontwait);
  }
  const auto bytes = state->size();
  pings_[h.request_id] = {now, kResync};
  resync_id_ = h.request_id;
  // Every update from here on is forwarded after the copy, on the same
  // connection: the backup applies them to it in order.
  active_ = true;
  last_heard_ = now;
  log("ps ", options_.ps_index, ": backup ps ", options_.backup_index,
      " answers again: copying this shard to it (", bytes, " bytes in ", pieces,
      pieces == 1 ? " message" : " messages", ") and forwarding its updates from here on");
}

void Replicator::take_piece(const wire::Header& answer, std::span<const std::uint8_t> bytes,
                            Clock::time_point sent, Clock::time_point now) {
  const auto piece = wire::ShardPiece::read(answer);
  if (piece.index == 0 && piece.total > max_state_bytes())
    return fence("the shard it hands back is " + std::to_string(piece.total) +
                 " bytes, more than the " + std::to_string(max_state_bytes()) +
                 " this ps takes (half this host's memory)");
  try {
    if (!handback_.add(answer.operand, piece.index, piece.total, bytes)) return;
  } catch (const ShardStateError& e) {
    // Asked for from the start again by the next ping.
    log("ps ", options_.ps_index, ": the shard backup ps ", options_.backup_index,
        " hands back is not taken: ", e.what());
    return;
  }
  if (piece.index == 0) handback_asked_ = sent;
  last_piece_ = now;
  if (!handback_.complete()) return ping(now, /*next_piece=*/true);
  const auto pieces = handback_.next();
  adopt(handback_.take(), handback_asked_, pieces);
}

void Replicator::adopt(std::span<const std::uint8_t> state, Clock::time_point sent,
                       std::uint64_t pieces) {
  if (!adopt_) return fence("it handed this shard back, which this ps cannot take");
  try {
    adopt_(state);
  } catch (const std::exception& e) {
    return fence(std::string("the shard it handed back does not fit here: ") + e.what());
  }
  joining_ = false;
  const auto seconds = std::chrono::duration<double>(Clock::now() - sent).count();
  stats_.rejoined();
  stats_.rejoin_took(seconds);
  log("ps ", options_.ps_index, ": re-joined: backup ps ", options_.backup_index,
      " handed this shard back (", state.size(), " bytes in ", pieces,
      pieces == 1 ? " message, " : " messages, ", seconds,
      " s after asking); serving it with every update the previous process acknowledged, "
      "the backup keeping its copy");
}

void Replicator::give_up(const std::string& why) {
  if (!active_) return;
  log("ps ", options_.ps_index, ": serving on without backup ps ", options_.backup_index, " (",
      options_.backup_address, "): ", why, "; its ", held_.size(),
      " forwards in flight are not waited for, and the shard has one copy until the backup "
      "answers again and gets a copy");
  stats_.backup_lost();
  active_ = false;
  resync_id_ = 0;
  joining_ = false;  // serving alone what it holds, it takes no shard handed over later
  handback_.clear();
  notice_due_ = true;
  for (auto& [key, held] : held_)
    if (held.reply) wire_.send(held.to, std::move(*held.reply));
  held_.clear();
  count_pending();
}

void Replicator::fence(const std::string& why) {
  log("ps ", options_.ps_index, ": backup ps ", options_.backup_index, " (",
      options_.backup_address, ") serves this ps's shard now (", why,
      "); this ps no longer "
      "serves it, and the ",
      held_.size(),
      " replies it held are dropped (their workers resend "
      "them to ps ",
      options_.backup_index, ")",
      notice_due_ ? "; it took over after this ps had given it up: updates this ps "
                    "acknowledged alone since are not in its copy"
                  : "");
  fenced_ = true;
  active_ = false;
  handback_.clear();
  held_.clear();
  pings_.clear();
  count_pending();
}

void Replicator::count_pending() { stats_.replication_pending(held_.size()); }

}  // namespace pstrain::ps
