#include "client/ps/ps_channel.h"

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <exception>
#include <mutex>
#include <random>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "shared/log.h"
#include "shared/messages.h"

namespace pstrain {

using wire::Header;
using wire::Op;

namespace {

// New for every process (a forked child gets its own), never 0: the ps keeps
// its record of applied requests per incarnation (server/dedup.h).
std::uint64_t process_incarnation() {
  static std::mutex mutex;
  static pid_t pid = 0;
  static std::uint64_t value = 0;
  const std::lock_guard lock(mutex);
  if (pid != ::getpid()) {
    pid = ::getpid();
    std::random_device random;
    value = (std::uint64_t{random()} << 32 | random()) ^
            static_cast<std::uint64_t>(std::time(nullptr)) ^ static_cast<std::uint64_t>(pid);
    if (value == 0) value = 1;
  }
  return value;
}

// Request ids are sequence numbers of the process, shared by all its
// channels (a worker's trainer and evaluator share its incarnation), so no
// two requests of one incarnation carry the same id.
std::uint64_t next_sequence() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void release_send(void*, void* hint) {
  static_cast<std::atomic<std::uint64_t>*>(hint)->fetch_sub(1);
}

}  // namespace

// Everything one call (a ticket) has in flight.
struct PsChannel::TicketState {
  Op op = Op::hello;
  std::string label;  // variable or key, for error messages
  double timeout_s = 0;
  std::size_t replies_left = 0;
  std::string error;
  std::uint64_t retry_after_ms = 0;  // of an error reply that says so
  std::vector<Reply> replies;        // of requests without a handler

  std::string describe() const {
    return std::string(wire::to_string(op)) + (label.empty() ? "" : " of '" + label + "'");
  }
};

struct PsChannel::Request {
  Ticket ticket = 0;
  std::uint32_t server = 0;
  ReplyHandler* handler = nullptr;
  std::uint64_t cookie = 0;
  // What a resend needs (data operations only): the encoded header, the
  // payload (the caller's; the channel's until the ticket is waited for),
  // and when it goes out again.
  Op op = Op::hello;
  bool payload_frame = false;
  std::vector<std::uint8_t> header{};
  std::span<const std::uint8_t> data{};
  std::span<const std::uint8_t> second{};  // a sparse push's rows
  Clock::duration interval{};
  Clock::time_point resend_at = Clock::time_point::max();
};

PsChannel::PsChannel(std::vector<std::string> addresses, std::uint64_t run_id,
                     PsClientOptions options)
    : addresses_(std::move(addresses)),
      run_id_(run_id),
      options_(std::move(options)),
      frames_held_(addresses_.size()),
      generations_(addresses_.size(), 0),
      generation_changed_(addresses_.size(), false),
      last_heard_(addresses_.size(), Clock::now()),
      acked_(addresses_.size(), 0),
      incarnation_(process_incarnation()),
      faults_(options_.fault, options_.fault_seed),
      context_(std::make_unique<zmq::context_t>(static_cast<int>(options_.io_threads))) {
  if (options_.curve && options_.curve->server_keys.size() != addresses_.size())
    throw std::invalid_argument(
        "ps client: " + std::to_string(addresses_.size()) + " ps addresses but " +
        std::to_string(options_.curve->server_keys.size()) + " CURVE server keys");
  for (std::uint32_t s = 0; s < addresses_.size(); ++s) serving_.push_back(s);
  trials_.resize(addresses_.size());
  for (std::uint32_t s = 0; s < addresses_.size(); ++s) sockets_.push_back(make_socket(s));
  batched_.resize(addresses_.size());
  batched_bytes_.resize(addresses_.size());
  batched_requests_.resize(addresses_.size());
}

PsChannel::~PsChannel() = default;

std::unique_ptr<zmq::socket_t> PsChannel::make_socket(std::uint32_t server) {
  return make_socket(server, serving_[server]);
}

std::unique_ptr<zmq::socket_t> PsChannel::make_socket(std::uint32_t server, std::uint32_t to) {
  auto socket = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::dealer);
  socket->set(zmq::sockopt::linger, 0);
  socket->set(zmq::sockopt::sndhwm, 0);
  socket->set(zmq::sockopt::rcvhwm, 0);
  socket->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(wire::kMaxFrameBytes));
  if (options_.curve) {
    socket->set(zmq::sockopt::curve_serverkey, options_.curve->server_keys.at(to));
    socket->set(zmq::sockopt::curve_publickey, options_.curve->own.public_key);
    socket->set(zmq::sockopt::curve_secretkey, options_.curve->own.secret_key);
  }
  if (to != server) {
    // Random per socket: a new trial never competes with an old one's
    // identity at the backup.
    std::random_device random;
    socket->set(
        zmq::sockopt::routing_id,
        wire::failover_peer(server) + std::to_string(std::uint64_t{random()} << 32 | random()));
  }
  socket->connect(addresses_[to]);
  return socket;
}

std::string PsChannel::where(std::uint32_t server) const {
  const auto to = serving_[server];
  return (to == server ? "ps " : "ps " + std::to_string(server) + "'s shard at ps ") +
         std::to_string(to) + " (" + addresses_[to] + ")";
}

std::vector<std::uint32_t> PsChannel::all_servers() const {
  std::vector<std::uint32_t> s;
  for (std::uint32_t i = 0; i < addresses_.size(); ++i)
    if (serving_[i] == i) s.push_back(i);
  return s;
}

PsChannel::Ticket PsChannel::open(Op op, std::string label, double timeout_s) {
  const Ticket id = next_ticket_++;
  auto& t = *tickets_.emplace(id, std::make_unique<TicketState>()).first->second;
  t.op = op;
  t.label = std::move(label);
  t.timeout_s = timeout_s;
  return id;
}

void PsChannel::send(Ticket ticket, std::uint32_t server, Header h,
                     std::span<const std::uint8_t> data, std::span<const std::uint8_t> bytes,
                     ReplyHandler* handler, std::uint64_t cookie,
                     std::span<const std::uint8_t> second) {
  auto& t = *tickets_.at(ticket);
  h.request_id = next_sequence();
  h.sender = options_.sender;
  h.incarnation = incarnation_;
  h.run_id = run_id_;
  const bool has_payload = !data.empty() || h.dtype == wire::DType::bytes;
  if (wire::is_sparse(h.op)) {
    h.payload_frames = second.empty() ? 1 : 2;
    h.elements = data.size() / sizeof(std::uint64_t);  // ids
  } else if (has_payload) {
    h.payload_frames = 1;
    h.elements = data.empty() ? bytes.size() : data.size() / wire::element_bytes(h.dtype);
  }
  Request r{.ticket = ticket,
            .server = server,
            .handler = handler,
            .cookie = cookie,
            .op = h.op,
            .payload_frame = has_payload,
            .header = wire::encode_header(h),
            .data = data,
            .second = second};
  // The data ops are resent: the ps answers a resent update from its
  // record, and a pull changes nothing.
  if (wire::is_data_op(h.op)) {
    r.interval = seconds(options_.retry_interval_s);
    r.resend_at = Clock::now() + r.interval;
  }
  transmit(r, bytes, /*zero_copy=*/true);
  if (!wire::is_data_op(h.op)) r.header = {};  // not needed again
  requests_.emplace(h.request_id, std::move(r));
  ++t.replies_left;
}

// Puts `r` on its ps's socket (unless fault injection drops it), or while a
// Batch lives into the ps's batch. A resend copies the payload: the first
// send's zero-copy frame may still sit in a queue, and a copy is ZeroMQ's to
// free whenever it likes.
//
// Sends never block: a socket with no connection to send on (under CURVE,
// one whose handshake the ps refused, or has not finished) takes nothing,
// and the request goes unanswered like a lost one (resent or timed out).
// Once the header is taken the payload is too (no high-water mark).
void PsChannel::transmit(const Request& r, std::span<const std::uint8_t> bytes, bool zero_copy,
                         zmq::socket_t* to) {
  if (faults_.drop(r.op)) return;
  const bool batched = batching_ && zero_copy;
  auto& frames = batched ? batched_[r.server] : unbatched_;
  if (!batched) frames.clear();  // what a send that threw left must not lead this one
  if (batched) {
    // Large requests stream: the ps applies a message's first chunk while
    // the next message is on its way, not after the whole call arrived.
    const auto bytes_now = r.header.size() + r.data.size() + r.second.size() + bytes.size();
    if (!frames.empty() && (batched_bytes_[r.server] + bytes_now > kMaxBatchBytes ||
                            batched_requests_[r.server] == wire::kMaxRequestsPerMessage))
      send_batch(r.server);
    batched_bytes_[r.server] += bytes_now;
    ++batched_requests_[r.server];
  }
  frames.emplace_back(r.header.data(), r.header.size());
  if (!r.data.empty()) {
    frames.push_back(payload_frame(r.server, r.data, zero_copy));
    if (!r.second.empty()) frames.push_back(payload_frame(r.server, r.second, zero_copy));
  } else if (r.payload_frame) {
    frames.emplace_back(bytes.data(), bytes.size());
  }
  if (!batched) send_frames(to ? *to : *sockets_[r.server], unbatched_);
}

zmq::message_t PsChannel::payload_frame(std::uint32_t server, std::span<const std::uint8_t> frame,
                                        bool zero_copy) {
  const auto data = const_cast<std::uint8_t*>(frame.data());
  if (!zero_copy) return zmq::message_t(data, frame.size());
  frames_held_[server].fetch_add(1);
  return zmq::message_t(data, frame.size(), &release_send, &frames_held_[server]);
}

// One message of `frames` on `socket`; frames the socket does not take
// are dropped (a zero-copy one released), as a lost message would be.
void PsChannel::send_frames(zmq::socket_t& socket, std::vector<zmq::message_t>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const auto more = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!socket.send(frames[i], more | zmq::send_flags::dontwait)) break;
  }
  frames.clear();
}

void PsChannel::send_batch(std::uint32_t server) {
  send_frames(*sockets_[server], batched_[server]);
  batched_bytes_[server] = 0;
  batched_requests_[server] = 0;
}

void PsChannel::send_batches() {
  for (std::uint32_t s = 0; s < batched_.size(); ++s)
    if (!batched_[s].empty()) send_batch(s);
}

PsChannel::Batch::Batch(PsChannel& channel)
    : channel_(channel), exceptions_(std::uncaught_exceptions()) {
  channel_.batching_ = true;
}

// Leaving on an exception, the caller is about to free the buffers the
// batched frames point into: they are dropped unsent (which releases them),
// and so is whatever a failing send left.
PsChannel::Batch::~Batch() {
  channel_.batching_ = false;
  try {
    if (std::uncaught_exceptions() == exceptions_) channel_.send_batches();
  } catch (const zmq::error_t&) {
  }
  for (std::uint32_t s = 0; s < channel_.batched_.size(); ++s) {
    channel_.batched_[s].clear();
    channel_.batched_bytes_[s] = 0;
    channel_.batched_requests_[s] = 0;
  }
}

// Resends every data request whose reply is overdue, each after twice as
// long as the time before, up to a quarter of the request timeout: a few
// more tries before the deadline when messages are lost, not a flood.
//
// A ps that still holds zero-copy frames and has not replied for a retry
// interval is not reading them (stalled, or gone and reconnecting): its
// socket is replaced, which makes ZeroMQ drop and release those frames,
// and every data request to it is resent on the new one. A ps that did
// reply meanwhile is reading, only behind: replacing its socket would lose
// the replies on their way to the old one and resend everything again,
// which on a loaded host repeats until requests time out. Control
// requests on a replaced socket are not resent (a heartbeat must not
// count twice); they end at their deadline.
void PsChannel::resend_due() {
  const auto now = Clock::now();
  const auto max_interval =
      std::max(seconds(options_.retry_interval_s), seconds(options_.timeout_s / 4));
  std::vector<bool> due(addresses_.size(), false);
  for (const auto& [rid, r] : requests_) due[r.server] = due[r.server] || r.resend_at <= now;
  for (std::uint32_t s = 0; s < due.size(); ++s) {
    if (!due[s]) continue;
    if (options_.failover_after_s > 0 && serving_[s] == s && !trials_[s] &&
        now - last_heard_[s] >= seconds(options_.failover_after_s))
      try_backup(s);
    const bool replace =
        frames_held_[s].load() > 0 && now - last_heard_[s] >= seconds(options_.retry_interval_s);
    if (replace) sockets_[s] = make_socket(s);
    for (auto& [rid, r] : requests_) {
      if (r.server != s || r.header.empty()) continue;
      const bool overdue = r.resend_at <= now;
      if (!overdue && !replace) continue;
      transmit(r, {}, /*zero_copy=*/false);
      if (trials_[s]) transmit(r, {}, /*zero_copy=*/false, trials_[s].get());
      if (overdue)
        r.interval = std::min(r.interval * 2, trials_[s] ? trial_interval() : max_interval);
      r.resend_at = now + r.interval;
    }
  }
}

void PsChannel::try_backup(std::uint32_t server) {
  const auto backup = (server + 1) % servers();
  log("ps client: ", where(server), " has not answered for ",
      std::chrono::duration<double>(Clock::now() - last_heard_[server]).count(),
      " s; its requests go to its backup ps ", backup, " too");
  trials_[server] = make_socket(server, backup);
  const auto now = Clock::now();
  for (auto& [rid, r] : requests_) {
    if (r.server != server || r.header.empty()) continue;
    r.interval = trial_interval();
    r.resend_at = now;
  }
}

// While a backup is on trial its answer is awaited often: it may take the
// shard over any moment after the ps fell silent.
PsChannel::Clock::duration PsChannel::trial_interval() const {
  return std::min(seconds(options_.retry_interval_s), seconds(options_.failover_after_s / 4));
}

void PsChannel::route(std::uint32_t server, bool to_backup) {
  if ((serving_[server] != server) == to_backup) return;
  if (to_backup) {
    trials_[server] = make_socket(server, (server + 1) % servers());
    return fail_over(server);
  }
  serving_[server] = server;
  sockets_[server] = make_socket(server);
  generations_[server] = 0;
  generation_changed_[server] = false;
}

void PsChannel::fail_over(std::uint32_t server) {
  serving_[server] = (server + 1) % servers();
  sockets_[server] = std::move(trials_[server]);
  // The backup's generation is its own, not a restart of the shard.
  generations_[server] = 0;
  generation_changed_[server] = false;
  log("ps client: ps ", server, "'s shard is served by its backup from here on: ", where(server));
}

PsChannel::Clock::time_point PsChannel::next_resend() const {
  auto next = Clock::time_point::max();
  for (const auto& [rid, r] : requests_) next = std::min(next, r.resend_at);
  return next;
}

std::vector<PsChannel::Reply> PsChannel::call(Op op, const std::vector<std::uint32_t>& servers,
                                              Header h, double timeout_s,
                                              std::span<const std::uint8_t> bytes) {
  for (auto s : servers)
    if (s >= addresses_.size())
      throw std::invalid_argument("ps client: no ps " + std::to_string(s) + " (the cluster has " +
                                  std::to_string(addresses_.size()) + ")");
  h.op = op;
  const Ticket id = open(op, h.name, timeout_s);
  for (auto s : servers) send(id, s, h, {}, bytes);
  return wait(id);
}

std::vector<PsChannel::Reply> PsChannel::wait(Ticket id) {
  auto it = tickets_.find(id);
  if (it == tickets_.end()) {
    if (id == 0 || id >= next_ticket_)
      throw std::invalid_argument("ps client: wait on unknown ticket " + std::to_string(id));
    return {};  // already waited for
  }
  auto replies = finish(id, *it->second);
  std::ranges::sort(replies, {}, &Reply::server);
  return replies;
}

bool PsChannel::answered(Ticket id) const {
  const auto it = tickets_.find(id);
  return it == tickets_.end() || it->second->replies_left == 0;
}

std::vector<PsChannel::Reply> PsChannel::finish(Ticket id, TicketState& t) {
  auto deadline = Clock::now() + seconds(t.timeout_s);
  while (t.replies_left > 0) {
    const auto before = t.replies_left;
    poll(std::min(deadline, next_resend()) - Clock::now());
    if (t.replies_left < before) {
      deadline = Clock::now() + seconds(t.timeout_s);
    } else if (Clock::now() >= deadline) {
      timed_out(id, t);
    }
  }
  // Every caller buffer ZeroMQ still reads from is released before a call
  // returns, and before an error leaves the channel: the caller may free
  // buffers of other calls while unwinding.
  wait_for_releases(Clock::now() + seconds(t.timeout_s));
  auto error = std::move(t.error);
  auto replies = std::move(t.replies);
  const std::chrono::milliseconds retry_after(t.retry_after_ms);
  tickets_.erase(id);
  if (!error.empty() && retry_after.count() > 0) throw PsRetryLater(error, retry_after);
  if (!error.empty()) throw PsError(error);
  return replies;
}

bool PsChannel::frames_released() const {
  return std::ranges::all_of(frames_held_, [](const auto& n) { return n.load() == 0; });
}

// Waits until ZeroMQ has released every zero-copy frame, serving replies
// and resends meanwhile: a ps that does not read its frames gets its
// requests resent, and its socket replaced, after retry_interval_s
// (resend_due). At `deadline` the sockets of every ps still holding frames
// are replaced (closed with linger 0, which frees their queued frames; their
// data requests go out again on the new ones) and it waits as long again.
// Frames still held after that would be read after the caller frees its
// buffers, so the process stops rather than return.
void PsChannel::wait_for_releases(Clock::time_point deadline) {
  const auto grace = deadline - Clock::now();
  bool replaced = false;
  while (!frames_released()) {
    if (Clock::now() >= deadline) {
      if (replaced) {
        std::fprintf(stderr,
                     "ps client: ZeroMQ kept zero-copy frames after their sockets "
                     "were closed; stopping rather than free buffers it may read\n");
        std::abort();
      }
      for (std::uint32_t s = 0; s < sockets_.size(); ++s)
        if (frames_held_[s].load() > 0) replace_socket(s);
      replaced = true;
      deadline = Clock::now() + std::max(grace, seconds(1));
    }
    poll(std::chrono::milliseconds(1));
  }
}

// A new DEALER for ps `server`; its data requests in flight go out again
// on it (replies to the old socket's identity are lost).
void PsChannel::replace_socket(std::uint32_t server) {
  sockets_[server] = make_socket(server);
  const auto now = Clock::now();
  for (auto& [rid, r] : requests_)
    if (r.server == server && !r.header.empty()) r.resend_at = now;
}

void PsChannel::timed_out(Ticket id, TicketState& t) {
  std::vector<std::uint32_t> silent;
  for (auto it = requests_.begin(); it != requests_.end();) {
    if (it->second.ticket != id) {
      ++it;
      continue;
    }
    if (std::ranges::find(silent, it->second.server) == silent.end())
      silent.push_back(it->second.server);
    it = requests_.erase(it);
  }
  std::ranges::sort(silent);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", t.timeout_s);
  std::string msg;
  for (auto s : silent)
    msg += (msg.empty() ? "" : "; ") + where(s) + ": no reply to " + t.describe() + " within " +
           secs + " s";
  // The silent ps may still hold our zero-copy frames in its queue; a fresh
  // socket drops them so the caller gets its buffers back.
  for (auto s : silent) replace_socket(s);
  wait_for_releases(Clock::now() + seconds(t.timeout_s));
  tickets_.erase(id);
  throw PsSilent(msg);
}

void PsChannel::abandon_all() {
  requests_.clear();  // their replies are dropped on arrival (dispatch)
  for (std::uint32_t s = 0; s < sockets_.size(); ++s)
    if (frames_held_[s].load() > 0) replace_socket(s);
  wait_for_releases(Clock::now() + seconds(options_.timeout_s));
  tickets_.clear();
}

void PsChannel::poll(Clock::duration timeout) {
  send_batches();  // a caller waiting while a Batch lives waits for these too
  // Every ps's socket, then the backups on trial; a socket an earlier
  // reply replaced or moved (fail-over) is read no more this time.
  std::vector<zmq::pollitem_t> items;
  std::vector<std::pair<std::uint32_t, bool>> of;  // (server, trial), by item
  for (std::uint32_t s = 0; s < sockets_.size(); ++s) {
    items.push_back({sockets_[s]->handle(), 0, ZMQ_POLLIN, 0});
    of.emplace_back(s, false);
  }
  for (std::uint32_t s = 0; s < trials_.size(); ++s) {
    if (!trials_[s]) continue;
    items.push_back({trials_[s]->handle(), 0, ZMQ_POLLIN, 0});
    of.emplace_back(s, true);
  }
  const auto ms =
      std::chrono::ceil<std::chrono::milliseconds>(std::max(timeout, Clock::duration::zero()));
  if (zmq_poll(items.data(), static_cast<int>(items.size()), static_cast<long>(ms.count())) < 0) {
    if (zmq_errno() == EINTR) return;
    throw zmq::error_t();
  }
  std::vector<zmq::message_t> frames;
  std::vector<std::span<const std::uint8_t>> views;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!(items[i].revents & ZMQ_POLLIN)) continue;
    const auto [s, trial] = of[i];
    const auto& socket = trial ? trials_[s] : sockets_[s];
    while (socket && socket->handle() == items[i].socket) {
      frames.clear();
      if (!zmq::recv_multipart(*socket, std::back_inserter(frames), zmq::recv_flags::dontwait))
        break;
      views.clear();
      for (const auto& f : frames) views.emplace_back(f.data<std::uint8_t>(), f.size());
      dispatch_message(s, trial, views, frames);
    }
  }
  resend_due();
}

namespace {

// Each reply of a received message, its header decoded and its payload
// frames (a last reply short of its frames gets what there is: dispatch()
// counts them); stops at a header that does not decode, where the replies
// after it start is unknown (their requests will be resent).
template <class F>
void for_each_reply(std::span<const std::span<const std::uint8_t>> frames, F f) {
  for (std::size_t at = 0; at < frames.size();) {
    Header h;
    try {
      h = wire::decode_header(frames[at]);
    } catch (const wire::ProtocolError&) {
      return;
    }
    const auto payloads = frames.subspan(at + 1).first(
        std::min<std::size_t>(h.payload_frames, frames.size() - at - 1));
    at += 1 + payloads.size();
    f(std::move(h), payloads);
  }
}

}  // namespace

void PsChannel::dispatch_message(std::uint32_t server, bool trial,
                                 std::span<const std::span<const std::uint8_t>> frames,
                                 std::span<zmq::message_t> messages) {
  // Whichever answers first serves the shard: the backup took it over, or
  // the ps itself lives. A backup's refusal (its copy given up) moves
  // nothing: the trial ends, and the requests wait for the ps (or fail).
  if (trial) {
    if (const auto refusal = trial_refusal(frames)) {
      log("ps client: ", where(server), "'s backup refuses its shard: ", *refusal);
      trials_[server].reset();
      return;
    }
    fail_over(server);
  } else {
    trials_[server].reset();
  }
  bool moved_back = false;
  for_each_reply(frames, [&](Header h, std::span<const std::span<const std::uint8_t>> payloads) {
    // The backup handed the shard back to a new process of the ps (a
    // restart that re-joined): the request goes there again, not failed.
    if (serving_[server] != server && h.status == wire::Status::error &&
        wire::ErrorReply::read(h).text.starts_with(wire::kMovedBack)) {
      moved_back = true;
      return;
    }
    // A single payload frame's message, for a handler to keep.
    zmq::message_t* message =
        payloads.size() == 1 ? &messages[static_cast<std::size_t>(payloads.data() - frames.data())]
                             : nullptr;
    dispatch(server, std::move(h), payloads, message);
  });
  if (!moved_back) return;
  route(server, false);
  log("ps client: ps ", server,
      " serves its shard again (its backup handed it back): ", where(server));
  last_heard_[server] = Clock::now();
  for (auto& [rid, r] : requests_)
    if (r.server == server) r.resend_at = last_heard_[server];
}

std::optional<std::string> PsChannel::trial_refusal(
    std::span<const std::span<const std::uint8_t>> frames) {
  bool ok = false;
  std::string text;
  for_each_reply(frames, [&](const Header& h, auto) {
    ok = ok || h.status == wire::Status::ok;
    if (text.empty() && h.status == wire::Status::error) text = wire::ErrorReply::read(h).text;
  });
  if (ok) return std::nullopt;
  return text.empty() ? "no readable reply" : text;
}

void PsChannel::dispatch(std::uint32_t server, Header h,
                         std::span<const std::span<const std::uint8_t>> payloads,
                         zmq::message_t* payload_message) {
  // With fail-over, a restarted ps may answer control requests before its
  // backup takes its shard over (and fences it); only the data it serves
  // tells that it restarted and serves the shard itself.
  if (options_.failover_after_s == 0 || wire::is_data_op(h.op))
    note_generation(server, h.generation);
  last_heard_[server] = Clock::now();
  const auto it = requests_.find(h.request_id);
  if (it == requests_.end()) return;  // given up on after a timeout, or a resend's twin
  const Request r = it->second;
  requests_.erase(it);
  auto& t = *tickets_.at(r.ticket);
  --t.replies_left;
  try {
    if (h.status == wire::Status::error) {
      const auto refusal = wire::ErrorReply::read(h);
      t.retry_after_ms = std::max(t.retry_after_ms, refusal.retry_after_ms);
      throw PsError(refusal.text);
    }
    if (h.op != t.op) throw PsError("reply is for " + std::string(wire::to_string(h.op)));
    if (payloads.size() != h.payload_frames)
      throw PsError("reply declares " + std::to_string(h.payload_frames) +
                    " payload frames, it has " + std::to_string(payloads.size()));
    for (std::size_t i = 0; i < h.payload_frames; ++i)
      wire::check_payload(h, i, payloads[i].size(), /*reply=*/true);
    const auto payload = h.payload_frames == 1 ? payloads[0] : std::span<const std::uint8_t>{};
    if (r.handler) {
      r.handler->on_reply(r.ticket, r.cookie, h, payload, payload_message);
    } else {
      t.replies.push_back({server, std::move(h), {payload.begin(), payload.end()}});
    }
    if (wire::is_update(r.op)) ++acked_[server];
  } catch (const std::exception& e) {
    if (t.error.empty()) t.error = where(server) + ": " + t.describe() + " failed: " + e.what();
  }
}

// Replies of a ps carry its generation; a new one means it restarted.
// 0 (a peer that does not say) is no news.
void PsChannel::note_generation(std::uint32_t server, std::uint64_t generation) {
  if (generation == 0 || generation == generations_[server]) return;
  if (generations_[server] != 0) generation_changed_[server] = true;
  generations_[server] = generation;
}

bool PsChannel::take_generation_change(std::uint32_t server) {
  const bool was = generation_changed_.at(server);
  generation_changed_[server] = false;
  return was;
}

}  // namespace pstrain
