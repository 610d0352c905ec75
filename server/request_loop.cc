#include "server/request_loop.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iterator>
#include <set>
#include <span>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "server/dispatcher.h"
#include "server/send_budget.h"
#include "server/zap_handler.h"
#include "shared/log.h"
#include "shared/messages.h"
#include "shared/trace.h"
#include "shared/tsan.h"

namespace pstrain::ps {
namespace {

using wire::Header;
using wire::Op;

// Set from the signal handler; the loop wakes at least every kPollInterval
// to look at it (and at the worker timeout).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
constexpr auto kPollInterval = std::chrono::milliseconds(100);
// Messages handled per wake-up at most (each of at most
// wire::kMaxRequestsPerMessage requests), so that signals, kv_get deadlines
// and the worker timeout are looked at under steady traffic too; and the
// bytes a batch takes off the socket before it is served (a batch holds its
// messages until it is done).
constexpr std::size_t kBatch = 256;
constexpr std::size_t kBatchBytes = 64 * 1024 * 1024;
// Replies to one message that leave together at most (Impl::send), like a
// client's requests (PsChannel::Batch).
constexpr std::size_t kReplyBatchBytes = 256 * 1024;

// A request's priority: its header's, or 0 when the header does not decode
// (the dispatcher then answers it with the error).
std::uint32_t priority_of(const std::vector<zmq::message_t>& messages) {
  if (messages.size() < 2) return 0;
  try {
    return wire::decode_header({messages[1].data<std::uint8_t>(), messages[1].size()}).priority;
  } catch (const wire::ProtocolError&) {
    return 0;
  }
}

// Installs the stop handlers for the lifetime of the loop and puts the
// previous ones back afterwards (a forked test or bench child may go on).
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGINT, &sa, &old_int_);
  }
  ~StopSignals() {
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGINT, &old_int_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

// The bytes a frame is sent from.
std::span<const std::uint8_t> bytes_of(const std::vector<std::uint8_t>& b) { return b; }
std::span<const std::uint8_t> bytes_of(const SharedBytes& b) { return *b; }
std::span<const std::uint8_t> bytes_of(const ValueBuffer& v) {
  return {reinterpret_cast<const std::uint8_t*>(v->data()), v->size() * sizeof(float)};
}
std::span<const std::uint8_t> bytes_of(const std::shared_ptr<const std::vector<std::uint16_t>>& v) {
  return {reinterpret_cast<const std::uint8_t*>(v->data()), v->size() * sizeof(std::uint16_t)};
}

// A frame ZeroMQ sends straight from `keep`'s bytes, without a copy. It holds
// `keep` and the reply's claim on the send budget until ZeroMQ drops it, on
// its I/O thread, once the bytes are on the wire: which is what lets the
// store see whether a pull still holds a chunk's buffer (copy-on-write), and
// the budget what is still queued. The hint crosses to that thread inside
// libzmq (shared/tsan.h).
template <class Keep>
zmq::message_t held_frame(Keep keep, std::shared_ptr<SendBudget::Claim> claim) {
  struct Held {
    Keep keep;
    std::shared_ptr<SendBudget::Claim> claim;
  };
  auto held = std::make_unique<Held>(Held{std::move(keep), std::move(claim)});
  const auto bytes = bytes_of(held->keep);
  tsan::handed_over(held.get());
  zmq::message_t msg(
      const_cast<std::uint8_t*>(bytes.data()), bytes.size(),
      [](void*, void* hint) {
        tsan::taken_over(hint);
        std::unique_ptr<Held> owned(static_cast<Held*>(hint));
      },
      held.get());
  held.release();  // owned by the message's free function from here on
  return msg;
}

std::string hex_bytes(const std::string& bytes) {
  std::string out = "0x";
  char buf[3];
  for (const unsigned char c : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

// Peers whose dropped replies are logged; drops to others are only counted.
constexpr std::size_t kMaxLoggedSlowPeers = 1024;

}  // namespace

// The loop's wire side is the dispatcher's sink: what the dispatcher passes
// on is encoded and sent here.
struct RequestLoop::Impl final : ReplySink {
  RequestLoopOptions options;
  PsStats& stats;
  StopSignals signals;
  Dispatcher dispatcher;
  FaultInjector faults;
  // Declared before the context, whose I/O thread releases claims: it is
  // gone by the time the budget is.
  SendBudget budget;
  std::set<Peer> slow_peers;  // logged for dropped replies; bounded
  // While a request is handled: its sender's identity (a view of the
  // received frame, not a copy per request) and IP address.
  std::optional<std::string_view> current_peer;
  std::string current_address;
  // The frames of the replies to it so far and their bytes, sent together
  // once it is handled or they hold kReplyBatchBytes (flush_replies).
  std::vector<zmq::message_t> batched;
  std::size_t batched_bytes = 0;
  zmq::context_t context{static_cast<int>(options.io_threads)};
  // Bound before the socket, so that no handshake is ever decided without it.
  std::optional<ZapHandler> zap;
  zmq::socket_t socket{context, zmq::socket_type::router};
  std::optional<Replicator> replicator;  // replication.replicas 2

  Impl(RequestLoopOptions opts, PsStats& s)
      : options(std::move(opts)),
        stats(s),
        dispatcher(
            {options.ps_index, options.run_id, options.config_hash, options.config_yaml,
             options.curve ? std::optional(options.curve->rights) : std::nullopt,
             options.replica_of,
             options.replication ? options.replication->backup_silence : std::chrono::seconds(2)},
            stats, *this),
        faults(options.fault, options.fault_seed) {
    if (options.replication) {
      replicator.emplace(context, *options.replication, stats, *this);
      dispatcher.set_replicator(&*replicator);
    }
    if (options.curve) {
      zap.emplace(context, options.curve->allowed,
                  "ps " + std::to_string(options.ps_index) + ": CURVE");
      socket.set(zmq::sockopt::curve_server, true);
      socket.set(zmq::sockopt::curve_secretkey, options.curve->own.secret_key);
      socket.set(zmq::sockopt::zap_domain, "pstrain");
    }
    socket.set(zmq::sockopt::sndhwm, 0);
    socket.set(zmq::sockopt::rcvhwm, 0);
    socket.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(wire::kMaxFrameBytes));
    // Replies to `done` and `shutdown` are the last messages; let them leave.
    socket.set(zmq::sockopt::linger, 2000);
  }

  std::chrono::milliseconds poll_timeout(const Coordinator& coordinator) const {
    std::chrono::milliseconds timeout = kPollInterval;
    if (const auto deadline = coordinator.next_deadline()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
      timeout =
          std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(0), timeout);
    }
    return timeout;
  }

  // Handles the requests that have arrived, without blocking, at most a
  // batch: taken off the socket first, then served in priority order
  // (wire::Header::priority; equal ones, and so one sender's requests of one
  // variable, in arrival order).
  void drain(Coordinator& coordinator) {
    std::vector<std::vector<zmq::message_t>> batch;
    std::vector<Clock::time_point> arrived;                    // off the socket, by index in batch
    std::vector<std::pair<std::uint32_t, std::size_t>> order;  // (priority, index in batch)
    std::size_t bytes = 0;
    while (batch.size() < kBatch && bytes < kBatchBytes) {
      std::vector<zmq::message_t> messages;
      if (!zmq::recv_multipart(socket, std::back_inserter(messages), zmq::recv_flags::dontwait))
        break;
      for (const auto& m : messages) bytes += m.size();
      order.emplace_back(priority_of(messages), batch.size());
      batch.push_back(std::move(messages));
      arrived.push_back(Clock::now());
    }
    std::ranges::stable_sort(order, {}, &std::pair<std::uint32_t, std::size_t>::first);
    std::vector<Frame> frames;
    for (const auto& [priority, index] : order) {
      if (coordinator.exit_code()) return;
      const auto& messages = batch[index];
      frames.clear();
      for (const auto& m : messages) frames.emplace_back(m.data<std::uint8_t>(), m.size());
      current_peer = messages[0].to_string_view();
      const char* address = zmq_msg_gets(messages.back().handle(), "Peer-Address");
      current_address = address ? address : "";
      // Under CURVE the ZAP handler named the connection's key.
      const char* user_id = zmq_msg_gets(messages.back().handle(), "User-Id");
      // Its time queued: behind the messages served before it in its batch.
      // Its requests' handlers (named by op) nest inside.
      const TraceSpan span(
          "message", "ps", {},
          trace::on() ? "\"queued_ms\":" + std::to_string(std::chrono::duration<double, std::milli>(
                                                              Clock::now() - arrived[index])
                                                              .count())
                      : std::string());
      dispatcher.handle(coordinator, frames, Clock::now(),
                        {user_id ? Identity::parse(user_id) : std::nullopt, current_address});
      flush_replies();
      current_peer.reset();
    }
  }

  // The replies to the message just handled leave as one message
  // (shared/protocol.h), its peer's identity first.
  void flush_replies() {
    if (batched.empty()) return;
    socket.send(zmq::buffer(current_peer->data(), current_peer->size()), zmq::send_flags::sndmore);
    for (std::size_t i = 0; i < batched.size(); ++i)
      socket.send(batched[i],
                  i + 1 < batched.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    batched.clear();
    batched_bytes = 0;
  }

  // What the dispatcher passes on: dropped by fault injection, or stamped
  // with the run id and generation, encoded and sent.
  void send(const Peer& to, Reply reply) override {
    Header& h = reply.header;
    if (faults.drop(h.op)) return stats.fault_drop();
    // Replies carry the run id, except hello's (protocol.h) and errors.
    if (h.status == wire::Status::ok && h.op != Op::hello) h.run_id = options.run_id;
    h.generation = options.generation;
    if (const auto* values = std::get_if<ValueBuffer>(&reply.payload)) {
      h.dtype = wire::DType::f32;
      h.elements = (*values)->size();
    } else if (const auto* bytes = std::get_if<SharedBytes>(&reply.payload)) {
      h.dtype = wire::DType::bytes;
      h.elements = (*bytes)->size();
    } else if (const auto* halves = std::get_if<HalfValues>(&reply.payload)) {
      h.dtype = halves->dtype;
      h.elements = halves->bits->size();
    }
    // A sparse reply counts rows, of the request's width (chunk).
    if (wire::is_sparse(h.op) && h.chunk > 0) h.elements /= h.chunk;
    const bool has_payload = !std::holds_alternative<std::monostate>(reply.payload);
    h.payload_frames = has_payload ? 1 : 0;
    auto header = wire::encode_header(h);
    std::shared_ptr<SendBudget::Claim> claim =
        budget.claim(to, SendBudget::cost(header.size(), reply.payload));
    if (!claim) return drop(to, h);
    stats.sent(h.op, header.size());
    std::vector<zmq::message_t> frames;
    frames.push_back(held_frame(std::move(header), claim));
    if (const auto* values = std::get_if<ValueBuffer>(&reply.payload)) {
      stats.sent(h.op, (*values)->size() * sizeof(float));
      frames.push_back(held_frame(*values, claim));
    } else if (const auto* bytes = std::get_if<SharedBytes>(&reply.payload)) {
      stats.sent(h.op, (*bytes)->size());
      frames.push_back(held_frame(*bytes, claim));
    } else if (const auto* halves = std::get_if<HalfValues>(&reply.payload)) {
      stats.sent(h.op, halves->bits->size() * sizeof(std::uint16_t));
      frames.push_back(held_frame(halves->bits, claim));
    }
    // A reply to the message being handled waits for the others to it,
    // until they hold kReplyBatchBytes: small replies (a push's
    // acknowledgement) share a message, large ones (a pull's values) leave
    // as they are ready, so the client copies one while the next is served.
    // One to another peer (a held pull released, a barrier) leaves now.
    if (current_peer == to) {
      std::size_t bytes = 0;
      for (const auto& f : frames) bytes += f.size();
      if (!batched.empty() && batched_bytes + bytes > kReplyBatchBytes) flush_replies();
      for (auto& f : frames) batched.push_back(std::move(f));
      batched_bytes += bytes;
      if (batched_bytes >= kReplyBatchBytes) flush_replies();  // a large reply: no wait
      return;
    }
    socket.send(zmq::message_t(to.data(), to.size()), zmq::send_flags::sndmore);
    for (std::size_t i = 0; i < frames.size(); ++i)
      socket.send(frames[i],
                  i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }

  // A reply the send budget has no room for: the peer has not read what it
  // was sent (or all peers together have not). Dropped, counted, and the
  // peer logged the first time.
  void drop(const Peer& to, const Header& reply) {
    stats.reply_dropped();
    if (slow_peers.size() >= kMaxLoggedSlowPeers || !slow_peers.insert(to).second) return;
    const std::string address =
        current_peer == to && !current_address.empty() ? current_address : "unknown";
    log("ps ", options.ps_index, ": dropped a ", wire::to_string(reply.op), " reply to peer ",
        hex_bytes(to), " (address ", address, "): it has ", budget.queued(to),
        " bytes of replies it has not read (the limit is ", SendBudget::kPerPeerBytes,
        " per peer, ", SendBudget::kTotalBytes, " in all, and ", budget.queued(),
        " are queued); its further drops are only counted (stats: replies_dropped)");
  }
};

RequestLoop::RequestLoop(RequestLoopOptions options, PsStats& stats)
    : impl_(std::make_unique<Impl>(std::move(options), stats)) {}

RequestLoop::~RequestLoop() = default;

Handlers& RequestLoop::handlers() { return impl_->dispatcher.handlers(); }
Handlers& RequestLoop::replica_handlers() { return impl_->dispatcher.replica_handlers(); }

void RequestLoop::set_shards(ShardAccess own, ShardAccess copy) {
  auto& impl = *impl_;
  impl.dispatcher.set_shards(std::move(own), std::move(copy));
  if (!impl.replicator) return;
  impl.replicator->set_shard(
      [&impl] { return impl.dispatcher.own_state(); },
      [&impl](std::span<const std::uint8_t> state) { impl.dispatcher.adopt_own_state(state); });
}

void RequestLoop::bind() {
  try {
    impl_->socket.bind(impl_->options.bind_address);
  } catch (const zmq::error_t& e) {
    throw NetworkError("cannot serve on " + impl_->options.bind_address + ": " + e.what());
  }
}

int RequestLoop::run(Coordinator& coordinator, const std::function<void(Clock::time_point)>& tick) {
  try {
    coordinator.start(Clock::now());
    while (!coordinator.exit_code()) {
      if (g_stop_signal) {
        log("stopping on signal ", static_cast<int>(g_stop_signal));
        return 0;
      }
      auto& replicator = impl_->replicator;
      zmq::pollitem_t items[2] = {
          {impl_->socket.handle(), 0, ZMQ_POLLIN, 0},
          {replicator ? replicator->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      const auto rc = zmq_poll(items, replicator ? 2 : 1,
                               static_cast<long>(impl_->poll_timeout(coordinator).count()));
      if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
      // Before the requests: after a stop, the primary's silence starts afresh.
      impl_->dispatcher.watch(Clock::now());
      if (rc > 0 && (items[0].revents & ZMQ_POLLIN)) impl_->drain(coordinator);
      if (replicator) {
        // The backup's answers release held replies, those that came while
        // the requests were served too (so a long batch does not make a
        // live backup look silent); then overdue forwards.
        replicator->receive(Clock::now());
        replicator->tick(Clock::now());
        impl_->dispatcher.resume(coordinator, Clock::now());
        // Its shard served by its backup, this ps has nothing of its own to
        // serve; the shard it keeps a copy of has been given up by its
        // primary too, which heard nothing from this ps as long. A new
        // process of it re-joins (its shard handed back, the copy sent to
        // it again), which is what a launcher's restart does.
        if (replicator->fenced()) {
          log("ps ", impl_->options.ps_index, ": exiting with ", kExitFenced,
              ": its shard is served by its backup; a restart of it re-joins");
          return kExitFenced;
        }
      }
      impl_->budget.forget_idle();
      const auto now = Clock::now();
      coordinator.tick(now);
      if (tick) tick(now);
    }
    return *coordinator.exit_code();
  } catch (const zmq::error_t& e) {
    throw NetworkError("network error while serving on " + impl_->options.bind_address + ": " +
                       e.what());
  }
}

bool RequestLoop::fenced() const { return impl_->replicator && impl_->replicator->fenced(); }

void RequestLoop::send(const Peer& to, Reply reply) {
  impl_->dispatcher.send(to, std::move(reply));
}
void RequestLoop::accepted(const wire::Header& request, std::uint64_t version) {
  impl_->dispatcher.accepted(request, version);
}
void RequestLoop::applied_step(const wire::StepRequest& step, std::span<const float> mean,
                               std::span<const Request> contributors) {
  impl_->dispatcher.applied_step(step, mean, contributors);
}
bool RequestLoop::serves_copy() const { return impl_->dispatcher.took_over(); }

}  // namespace pstrain::ps
