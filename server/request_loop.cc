#include "server/request_loop.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <set>
#include <span>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "server/dedup.h"
#include "server/send_budget.h"
#include "server/zap_handler.h"
#include "shared/config.h"
#include "shared/init.h"
#include "shared/log.h"
#include "shared/messages.h"

namespace pstrain::ps {
namespace {

using wire::Header;
using wire::Op;

// Set from the signal handler; the loop wakes at least every kPollInterval
// to look at it (and at the worker timeout).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
constexpr auto kPollInterval = std::chrono::milliseconds(100);
// Requests handled per wake-up at most, so that signals, kv_get deadlines
// and the worker timeout are looked at under steady traffic too.
constexpr int kBatch = 256;

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

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The bytes a frame is sent from.
std::span<const std::uint8_t> bytes_of(const std::vector<std::uint8_t>& b) { return b; }
std::span<const std::uint8_t> bytes_of(const SharedBytes& b) { return *b; }
std::span<const std::uint8_t> bytes_of(const ValueBuffer& v) {
  return {reinterpret_cast<const std::uint8_t*>(v->data()), v->size() * sizeof(float)};
}

// A frame ZeroMQ sends straight from `keep`'s bytes, without a copy. It holds
// `keep` and the reply's claim on the send budget until ZeroMQ drops it, on
// its I/O thread, once the bytes are on the wire: which is what lets the
// store see whether a pull still holds a chunk's buffer (copy-on-write), and
// the budget what is still queued.
template <class Keep>
zmq::message_t held_frame(Keep keep, std::shared_ptr<SendBudget::Claim> claim) {
  struct Held {
    Keep keep;
    std::shared_ptr<SendBudget::Claim> claim;
  };
  auto held = std::make_unique<Held>(Held{std::move(keep), std::move(claim)});
  const auto bytes = bytes_of(held->keep);
  zmq::message_t msg(
      const_cast<std::uint8_t*>(bytes.data()), bytes.size(),
      [](void*, void* hint) { std::unique_ptr<Held> owned(static_cast<Held*>(hint)); },
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

struct RequestLoop::Impl {
  RequestLoopOptions options;
  PsStats& stats;
  StopSignals signals;
  Handlers handlers;
  Dedup dedup;
  FaultInjector faults;
  // Declared before the context, whose I/O thread releases claims: it is
  // gone by the time the budget is.
  SendBudget budget;
  std::set<Peer> slow_peers;  // logged for dropped replies; bounded
  // While a request is handled: its sender and the sender's IP address.
  const Peer* current_peer = nullptr;
  std::string current_address;
  // While a recorded op's handler runs: its request, whose reply send()
  // records in dedup.
  const Header* recording = nullptr;
  // While a resent push_pull is answered through the pull handler: the op
  // its reply must carry.
  std::optional<Op> answering_as;
  std::size_t refusals_logged = 0;  // check_run
  // (peer address, op) pairs whose refusal was logged; bounded, the count
  // (PsStats::refused) has the rest.
  std::set<std::pair<std::string, Op>> rights_refusals_logged;
  static constexpr std::size_t kMaxRightsRefusalsLogged = 256;
  zmq::context_t context;
  // Bound before the socket, so that no handshake is ever decided without it.
  std::optional<ZapHandler> zap;
  zmq::socket_t socket{context, zmq::socket_type::router};

  Impl(RequestLoopOptions opts, PsStats& s)
      : options(std::move(opts)), stats(s), faults(options.fault, options.fault_seed) {
    if (options.curve) {
      zap.emplace(context, options.curve->allowed, prefix() + "CURVE");
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

  std::string prefix() const { return "ps " + std::to_string(options.ps_index) + ": "; }

  std::chrono::milliseconds poll_timeout(const Coordinator& coordinator) const {
    std::chrono::milliseconds timeout = kPollInterval;
    if (const auto deadline = coordinator.next_deadline()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
      timeout = std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(0), timeout);
    }
    return timeout;
  }

  // Handles the requests that have arrived, without blocking, at most a batch.
  void drain(Coordinator& coordinator) {
    std::vector<zmq::message_t> frames;
    for (int n = 0; n < kBatch && !coordinator.exit_code(); ++n) {
      frames.clear();
      if (!zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait))
        return;
      for (const auto& f : frames) stats.received(f.size());
      handle(coordinator, frames);
    }
  }

  void handle(Coordinator& coordinator, std::vector<zmq::message_t>& frames) {
    Request request;
    request.from = frames[0].to_string();
    request.received = Clock::now();
    current_peer = &request.from;
    const char* address = zmq_msg_gets(frames.back().handle(), "Peer-Address");
    current_address = address ? address : "";
    struct Clear {
      const Peer*& peer;
      ~Clear() { peer = nullptr; }
    } clear{current_peer};
    if (frames.size() < 2) {
      stats.malformed();
      return send(request.from, {bad_header_reply("message has no header frame"), {}});
    }
    try {
      request.header = wire::decode_header({frames[1].data<std::uint8_t>(), frames[1].size()});
    } catch (const wire::ProtocolError& e) {
      stats.malformed();
      return send(request.from, {bad_header_reply(std::string("bad header: ") + e.what()), {}});
    }
    stats.request(request.header.op);
    try {
      check(request.header, frames);
      check_run(request.header);
      if (request.header.payload_frames == 1)
        request.payload = {frames[2].data<std::uint8_t>(), frames[2].size()};
      if (options.curve) {
        if (const auto why = refusal_of(frames[1], request.header)) {
          stats.refused();
          stats.error();
          return send(request.from,
                      {wire::error_reply(request.header, prefix() + "refused: " + *why), {}});
        }
      }
      if (!coordinator.admit(request)) return stats.error();
      const Handler* handler = handlers.find(request.header.op);
      if (!handler) throw wire::ProtocolError("this ps does not serve the op");
      if (request.header.op == Op::hello) dedup.hello(request.header);
      const auto seen = dedup.find(request.header);
      if (seen.verdict == Dedup::Verdict::resent) return answer_resend(request, seen.version);
      if (seen.verdict == Dedup::Verdict::too_old) {
        stats.too_old();
        throw std::runtime_error("request id " + std::to_string(request.header.request_id) +
                                 " is older than the last " + std::to_string(Dedup::kWindow) +
                                 " this ps recorded for the sender; it may have been applied "
                                 "already, so it is not applied again");
      }
      recording = &request.header;
      (*handler)(request);
      recording = nullptr;
    } catch (const std::exception& e) {
      recording = nullptr;
      answering_as.reset();
      stats.error();
      send(request.from,
           {wire::error_reply(request.header, prefix() + describe(request.header) + ": " + e.what()),
            {}});
    }
  }

  // A resend of an update this ps applied already (server/dedup.h says what
  // it is answered with).
  void answer_resend(const Request& request, std::uint64_t version) {
    stats.resend_answered();
    if (request.header.op != Op::push_pull) {
      Reply reply{wire::reply_to(request.header), {}};
      wire::ChunkReply{version}.write(reply.header);
      return send(request.from, std::move(reply));
    }
    Request as_pull = request;
    as_pull.header.op = Op::pull;
    as_pull.header.payload_frames = 0;
    as_pull.header.elements = 0;
    as_pull.payload = {};
    answering_as = Op::push_pull;
    (*handlers.find(Op::pull))(as_pull);
    answering_as.reset();
  }

  // Why the identity of the connection `frame` came on may not send
  // `request` (nullopt: it may); logs the first refusal per peer and op.
  std::optional<std::string> refusal_of(zmq::message_t& frame, const Header& request) {
    const char* user_id = zmq_msg_gets(frame.handle(), "User-Id");
    const auto who = user_id ? Identity::parse(user_id) : std::nullopt;
    auto why = who ? refusal(*who, request, options.curve->rights)
                   : std::optional<std::string>("the connection has no identity");
    if (why && rights_refusals_logged.size() < kMaxRightsRefusalsLogged) {
      const char* address = zmq_msg_gets(frame.handle(), "Peer-Address");
      if (rights_refusals_logged.emplace(address ? address : "?", request.op).second)
        log(prefix(), "refused ", wire::to_string(request.op), " from ",
            address ? address : "?", ": ", *why);
    }
    return why;
  }

  // A request of another run is refused with what kind of mismatch it is;
  // the values go to our log only (request_loop.h).
  void check_run(const Header& request) {
    if (request.run_id == options.run_id) return;
    std::string reply, logged;
    const auto hello = request.op == Op::hello ? wire::Hello::read(request).config_yaml : "";
    if (hello.empty()) {
      reply = "run id differs: the sender belongs to another launch or uses a different config";
      logged = "sent run id " + hex(request.run_id) + ", this run's is " + hex(options.run_id);
    } else if (fnv1a64(hello) == options.config_hash) {
      reply = "run id differs: the sender is a process of another launch of this config (a "
              "stale process of an earlier run, or one started without this launch's --run-id); "
              "it is not part of this run";
      logged = "same config, run id " + hex(request.run_id) + " of another launch (this one's is " +
               hex(options.run_id) + ")";
    } else {
      reply = "config differs in: " + config_difference_keys(options.config_yaml, hello) +
              " — all processes must use the same cluster.yaml and --set overrides";
      logged = "config differs (ps vs sender: " +
               config_differences(options.config_yaml, hello) + ")";
    }
    if (refusals_logged < RequestLoop::kMaxLoggedRefusals)
      log(prefix(), "refused ", describe(request), " from sender ", request.sender, ": ", logged,
          ++refusals_logged == RequestLoop::kMaxLoggedRefusals
              ? "; further refusals of other runs are not logged (stats: errors)"
              : "");
    throw wire::ProtocolError(reply);
  }

  // What every request must satisfy before its handler sees it.
  void check(const Header& request, const std::vector<zmq::message_t>& frames) const {
    if (request.protocol != wire::kProtocolVersion)
      throw wire::ProtocolError("protocol version differs: ps speaks " +
                                std::to_string(wire::kProtocolVersion) + ", sender " +
                                std::to_string(request.sender) + " speaks " +
                                std::to_string(request.protocol));
    if (frames.size() != 2 + request.payload_frames)
      throw wire::ProtocolError("header declares " + std::to_string(request.payload_frames) +
                                " payload frames, the message has " +
                                std::to_string(frames.size() - 2));
    for (std::size_t i = 0; i < request.payload_frames; ++i)
      wire::check_payload(request, i, frames[2 + i].size());
  }

  void send(const Peer& to, Reply reply) {
    Header& h = reply.header;
    if (answering_as) h.op = *answering_as;
    if (recording && h.status == wire::Status::ok && h.request_id == recording->request_id)
      dedup.record(*recording, h.version);
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
    }
    const bool has_payload = !std::holds_alternative<std::monostate>(reply.payload);
    h.payload_frames = has_payload ? 1 : 0;
    auto header = wire::encode_header(h);
    std::shared_ptr<SendBudget::Claim> claim =
        budget.claim(to, SendBudget::cost(header.size(), reply.payload));
    if (!claim) return drop(to, h);
    stats.sent(header.size());
    zmq::message_t id(to.data(), to.size());
    socket.send(id, zmq::send_flags::sndmore);
    socket.send(held_frame(std::move(header), claim),
                has_payload ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (const auto* values = std::get_if<ValueBuffer>(&reply.payload)) {
      stats.sent((*values)->size() * sizeof(float));
      socket.send(held_frame(*values, claim), zmq::send_flags::none);
    } else if (const auto* bytes = std::get_if<SharedBytes>(&reply.payload)) {
      stats.sent((*bytes)->size());
      socket.send(held_frame(*bytes, claim), zmq::send_flags::none);
    }
  }

  // A reply the send budget has no room for: the peer has not read what it
  // was sent (or all peers together have not). Dropped, counted, and the
  // peer logged the first time.
  void drop(const Peer& to, const Header& reply) {
    stats.reply_dropped();
    if (slow_peers.size() >= kMaxLoggedSlowPeers || !slow_peers.insert(to).second) return;
    const std::string address =
        current_peer && *current_peer == to && !current_address.empty() ? current_address
                                                                         : "unknown";
    log(prefix(), "dropped a ", wire::to_string(reply.op), " reply to peer ", hex_bytes(to),
        " (address ", address, "): it has ", budget.queued(to),
        " bytes of replies it has not read (the limit is ", SendBudget::kPerPeerBytes,
        " per peer, ", SendBudget::kTotalBytes, " in all, and ", budget.queued(),
        " are queued); its further drops are only counted (stats: replies_dropped)");
  }
};

RequestLoop::RequestLoop(RequestLoopOptions options, PsStats& stats)
    : impl_(std::make_unique<Impl>(std::move(options), stats)) {}

RequestLoop::~RequestLoop() = default;

Handlers& RequestLoop::handlers() { return impl_->handlers; }

void RequestLoop::bind() {
  try {
    impl_->socket.bind(impl_->options.bind_address);
  } catch (const zmq::error_t& e) {
    throw NetworkError("cannot serve on " + impl_->options.bind_address + ": " + e.what());
  }
}

int RequestLoop::run(Coordinator& coordinator,
                     const std::function<void(Clock::time_point)>& tick) {
  try {
    coordinator.start(Clock::now());
    while (!coordinator.exit_code()) {
      if (g_stop_signal) {
        log("stopping on signal ", static_cast<int>(g_stop_signal));
        return 0;
      }
      zmq::pollitem_t item{impl_->socket.handle(), 0, ZMQ_POLLIN, 0};
      const auto rc = zmq_poll(&item, 1, static_cast<long>(impl_->poll_timeout(coordinator).count()));
      if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
      if (rc > 0) impl_->drain(coordinator);
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

void RequestLoop::send(const Peer& to, Reply reply) { impl_->send(to, std::move(reply)); }

}  // namespace pstrain::ps
