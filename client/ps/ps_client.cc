#include "client/ps/ps_client.h"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "shared/fault.h"
#include "shared/init.h"
#include "shared/messages.h"

namespace pstrain {

using wire::Header;
using wire::Op;
using Clock = std::chrono::steady_clock;

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
// clients (a worker's trainer and evaluator share its incarnation), so no
// two requests of one incarnation carry the same id.
std::uint64_t next_sequence() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// The ops a client resends: the ps answers a resent update from its record,
// and a pull changes nothing.
bool resendable(Op op) {
  return op == Op::init || op == Op::pull || op == Op::push || op == Op::push_pull ||
         op == Op::assign;
}

template <class T>
std::span<const std::uint8_t> bytes_of(std::span<const T> values) {
  return {reinterpret_cast<const std::uint8_t*>(values.data()), values.size_bytes()};
}

wire::DType wire_type(WireDType type) {
  switch (type) {
    case WireDType::bf16:
      return wire::DType::bf16;
    case WireDType::fp16:
      return wire::DType::fp16;
    case WireDType::fp32:
      break;
  }
  return wire::DType::f32;
}

// An error reply that said when to ask again (wire::ErrorReply).
struct RetryLater : PsError {
  RetryLater(const std::string& what, std::chrono::milliseconds wait)
      : PsError(what), after(wait) {}
  std::chrono::milliseconds after;
};

}  // namespace

struct PsClient::Impl {
  static constexpr std::uint32_t kNoVariable = ~0u;

  struct Reply {
    std::uint32_t server = 0;
    Header header;
    std::vector<std::uint8_t> bytes;  // payload of control replies (kv_get)
  };

  // Everything one call (a ticket) has in flight.
  struct TicketState {
    Op op = Op::hello;
    std::uint32_t variable = kNoVariable;
    std::string label;  // variable or key, for error messages
    double timeout_s = 0;
    std::size_t replies_left = 0;
    std::string error;
    std::uint64_t retry_after_ms = 0;  // of an error reply that says so
    double staleness_sum = 0;
    std::size_t staleness_chunks = 0;
    std::vector<Reply> control;  // replies of control operations
    // A push's gradient rounded to the wire dtype, sent from here.
    std::vector<std::uint16_t> halves;
  };

  struct Request {
    Ticket ticket = 0;
    std::uint32_t server = 0;
    const ChunkRef* chunk = nullptr;  // data operations
    float* out = nullptr;             // where pulled values of the variable go
    // What a resend needs (data operations only): the encoded header, the
    // payload (the caller's, or the ticket's rounded copy; the library's until
    // the ticket is waited for), and when it goes out again.
    Op op = Op::hello;
    bool payload_frame = false;
    std::vector<std::uint8_t> header{};
    std::span<const std::uint8_t> data{};
    Clock::duration interval{};
    Clock::time_point resend_at = Clock::time_point::max();
  };

  std::vector<std::string> addresses;
  // Zero-copy frames ZeroMQ has not released yet, per ps, over all tickets:
  // decremented from ZeroMQ's I/O thread, hence atomic. They belong to the
  // client rather than a ticket, whose state may be gone by the time the I/O
  // thread notifies; declared before the context, which releases the last
  // frames when it terminates.
  std::vector<std::atomic<std::uint64_t>> frames_held;
  std::unordered_map<Ticket, std::unique_ptr<TicketState>> tickets;
  std::unordered_map<std::uint64_t, Request> requests;
  ShardMap map;
  std::uint64_t run_id;
  PsClientOptions options;
  wire::DType wire_dtype;  // of pulls, pushes and their replies (options.wire_dtype)
  std::vector<std::uint64_t> pulled_version;  // per chunk of map.all_chunks()
  std::uint64_t clock = 0;                    // set_clock(): what data requests carry
  std::vector<double> staleness;              // per variable
  std::vector<std::uint64_t> generations;     // per ps: the latest its replies carried
  std::vector<bool> generation_changed;       // per ps: since take_generation_change
  std::vector<Clock::time_point> last_heard;  // per ps: its latest reply (resend_due)
  // Per ps: chunk updates (push, push_pull, assign) it acknowledged, which
  // hello reports so a restored ps can count what its restore lost.
  std::vector<std::uint64_t> acked;
  std::uint64_t incarnation = process_incarnation();
  FaultInjector faults;
  Ticket next_ticket = 1;
  zmq::context_t context;
  std::vector<zmq::socket_t> sockets;

  Impl(std::vector<std::string> ps_addresses, ShardMap shard_map, std::uint64_t run,
       PsClientOptions opts)
      : addresses(std::move(ps_addresses)),
        frames_held(addresses.size()),
        map(std::move(shard_map)),
        run_id(run),
        options(opts),
        wire_dtype(wire_type(options.wire_dtype)),
        pulled_version(map.all_chunks().size(), 0),
        staleness(map.variables().size(), 0.0),
        generations(addresses.size(), 0),
        generation_changed(addresses.size(), false),
        last_heard(addresses.size(), Clock::now()),
        acked(addresses.size(), 0),
        faults(options.fault, options.fault_seed),
        context(1) {
    if (options.curve && options.curve->server_keys.size() != addresses.size())
      throw std::invalid_argument(
          "ps client: " + std::to_string(addresses.size()) + " ps addresses but " +
          std::to_string(options.curve->server_keys.size()) + " CURVE server keys");
    if (addresses.size() != map.servers())
      throw std::invalid_argument("ps client: " + std::to_string(addresses.size()) +
                                  " ps addresses but the shard map has " +
                                  std::to_string(map.servers()) + " servers");
    for (std::uint32_t s = 0; s < addresses.size(); ++s) sockets.push_back(make_socket(s));
  }

  zmq::socket_t make_socket(std::uint32_t server) {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::sndhwm, 0);
    socket.set(zmq::sockopt::rcvhwm, 0);
    socket.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(wire::kMaxFrameBytes));
    if (options.curve) {
      socket.set(zmq::sockopt::curve_serverkey, options.curve->server_keys.at(server));
      socket.set(zmq::sockopt::curve_publickey, options.curve->own.public_key);
      socket.set(zmq::sockopt::curve_secretkey, options.curve->own.secret_key);
    }
    socket.connect(addresses[server]);
    return socket;
  }

  std::string where(std::uint32_t server) const {
    return "ps " + std::to_string(server) + " (" + addresses[server] + ")";
  }

  static std::string describe(const TicketState& t) {
    return std::string(wire::to_string(t.op)) + (t.label.empty() ? "" : " of '" + t.label + "'");
  }

  std::uint32_t variable_index(std::string_view name) const {
    const auto v = map.find(name);
    if (!v) throw PsError("ps client: unknown variable '" + std::string(name) + "'");
    return *v;
  }

  std::pair<Ticket, TicketState&> start(Op op, std::string label, double timeout_s) {
    const Ticket id = next_ticket++;
    auto& t = *tickets.emplace(id, std::make_unique<TicketState>()).first->second;
    t.op = op;
    t.label = std::move(label);
    t.timeout_s = timeout_s;
    return {id, t};
  }

  static void release_send(void*, void* hint) {
    static_cast<std::atomic<std::uint64_t>*>(hint)->fetch_sub(1);
  }

  // Sends one request; `data` (values or a gradient, of h.dtype) goes out
  // zero-copy, `bytes` (small control payloads) are copied. Data requests are
  // resent from `requests` until their reply comes (resend_due).
  void send(Ticket id, TicketState& t, Request r, Header h, std::span<const std::uint8_t> data,
            std::span<const std::uint8_t> bytes = {}) {
    h.request_id = next_sequence();
    h.sender = options.sender;
    h.incarnation = incarnation;
    h.run_id = run_id;
    const bool has_payload = !data.empty() || h.dtype == wire::DType::bytes;
    if (has_payload) {
      h.payload_frames = 1;
      h.elements = data.empty() ? bytes.size() : data.size() / wire::element_bytes(h.dtype);
    }
    r.ticket = id;
    r.op = h.op;
    r.payload_frame = has_payload;
    r.header = wire::encode_header(h);
    r.data = data;
    if (resendable(h.op)) {
      r.interval = seconds(options.retry_interval_s);
      r.resend_at = Clock::now() + r.interval;
    }
    transmit(r, bytes, /*zero_copy=*/true);
    if (!resendable(h.op)) r.header = {};  // not needed again
    requests.emplace(h.request_id, std::move(r));
    ++t.replies_left;
  }

  // Puts `r` on its ps's socket (unless fault injection drops it). A resend
  // copies the payload: the first send's zero-copy frame may still sit in a
  // queue, and a copy is ZeroMQ's to free whenever it likes.
  //
  // Sends never block: a socket with no connection to send on (under CURVE,
  // one whose handshake the ps refused, or has not finished) takes nothing,
  // and the request goes unanswered like a lost one (resent or timed out).
  // Once the header is taken the payload is too (no high-water mark).
  void transmit(const Request& r, std::span<const std::uint8_t> bytes, bool zero_copy) {
    if (faults.drop(r.op)) return;
    const bool has_payload = r.payload_frame;
    auto& socket = sockets[r.server];
    const auto more = has_payload ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!socket.send(zmq::buffer(r.header), more | zmq::send_flags::dontwait)) return;
    if (!r.data.empty()) {
      const auto data = const_cast<std::uint8_t*>(r.data.data());
      if (zero_copy) {
        frames_held[r.server].fetch_add(1);
        zmq::message_t payload(data, r.data.size(), &Impl::release_send, &frames_held[r.server]);
        (void)socket.send(payload, zmq::send_flags::dontwait);
      } else {
        zmq::message_t payload(data, r.data.size());
        (void)socket.send(payload, zmq::send_flags::dontwait);
      }
    } else if (has_payload) {
      (void)socket.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::dontwait);
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
  void resend_due() {
    const auto now = Clock::now();
    const auto max_interval =
        std::max(seconds(options.retry_interval_s), seconds(options.timeout_s / 4));
    std::vector<bool> due(addresses.size(), false);
    for (const auto& [rid, r] : requests) due[r.server] = due[r.server] || r.resend_at <= now;
    for (std::uint32_t s = 0; s < due.size(); ++s) {
      if (!due[s]) continue;
      const bool replace =
          frames_held[s].load() > 0 && now - last_heard[s] >= seconds(options.retry_interval_s);
      if (replace) sockets[s] = make_socket(s);
      for (auto& [rid, r] : requests) {
        if (r.server != s || r.header.empty()) continue;
        const bool overdue = r.resend_at <= now;
        if (!overdue && !replace) continue;
        transmit(r, {}, /*zero_copy=*/false);
        if (overdue) r.interval = std::min(r.interval * 2, max_interval);
        r.resend_at = now + r.interval;
      }
    }
  }

  Clock::time_point next_resend() const {
    auto next = Clock::time_point::max();
    for (const auto& [rid, r] : requests) next = std::min(next, r.resend_at);
    return next;
  }

  Ticket data_op(Op op, std::string_view name, std::span<const float> grad, std::span<float> out,
                 std::size_t given) {
    const auto v = variable_index(name);
    const auto size = map.variables()[v].size;
    if (given != size)
      throw std::invalid_argument("ps client: " + std::string(wire::to_string(op)) + " of '" +
                                  std::string(name) + "': buffer of " + std::to_string(given) +
                                  " floats, the variable has " + std::to_string(size));
    auto [id, t] = start(op, std::string(name), options.timeout_s);
    t.variable = v;
    const auto half = wire::half_format(wire_dtype);
    if (half && !grad.empty()) {
      t.halves.resize(grad.size());
      encode_halves(*half, grad.data(), t.halves.data(), grad.size());
    }
    for (const auto& c : map.chunks(v)) {
      Header h;
      h.op = op;
      h.dtype = wire_dtype;
      const auto g = static_cast<std::size_t>(&c - map.all_chunks().data());
      wire::ChunkRequest{map.variables()[v].name, c.index, clock, pulled_version[g], v}.write(h);
      std::span<const std::uint8_t> payload;
      if (half && !grad.empty()) {
        payload = bytes_of(std::span<const std::uint16_t>(t.halves).subspan(c.offset, c.count));
      } else if (!grad.empty()) {
        payload = bytes_of(grad.subspan(c.offset, c.count));
      }
      send(id, t, {0, c.server, &c, out.empty() ? nullptr : out.data()}, std::move(h), payload);
    }
    return id;
  }

  // Sends a control request to each of `servers` and waits for the replies.
  std::vector<Reply> control(Op op, const std::vector<std::uint32_t>& servers, Header h,
                             double timeout_s, std::span<const std::uint8_t> bytes = {}) {
    for (auto s : servers)
      if (s >= addresses.size())
        throw std::invalid_argument("ps client: no ps " + std::to_string(s) + " (the cluster has " +
                                    std::to_string(addresses.size()) + ")");
    h.op = op;
    auto [id, t] = start(op, h.name, timeout_s);
    for (auto s : servers) send(id, t, {0, s, nullptr, nullptr}, h, {}, bytes);
    auto replies = finish(id, t);
    std::ranges::sort(replies, {}, &Reply::server);
    return replies;
  }

  std::vector<std::uint32_t> all_servers() const {
    std::vector<std::uint32_t> s(addresses.size());
    for (std::uint32_t i = 0; i < s.size(); ++i) s[i] = i;
    return s;
  }

  void wait(Ticket id) {
    auto it = tickets.find(id);
    if (it == tickets.end()) {
      if (id == 0 || id >= next_ticket)
        throw std::invalid_argument("ps client: wait on unknown ticket " + std::to_string(id));
      return;  // already waited for
    }
    finish(id, *it->second);
  }

  std::vector<Reply> finish(Ticket id, TicketState& t) {
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
    // returns, and before an error leaves the client: the caller may free
    // buffers of other calls while unwinding.
    wait_for_releases(Clock::now() + seconds(t.timeout_s));
    if (t.variable != kNoVariable && t.staleness_chunks > 0)
      staleness[t.variable] = t.staleness_sum / static_cast<double>(t.staleness_chunks);
    auto error = std::move(t.error);
    auto replies = std::move(t.control);
    const std::chrono::milliseconds retry_after(t.retry_after_ms);
    tickets.erase(id);
    if (!error.empty() && retry_after.count() > 0) throw RetryLater(error, retry_after);
    if (!error.empty()) throw PsError(error);
    return replies;
  }

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  bool frames_released() const {
    return std::ranges::all_of(frames_held, [](const auto& n) { return n.load() == 0; });
  }

  // Waits until ZeroMQ has released every zero-copy frame, serving replies
  // and resends meanwhile: a ps that does not read its frames gets its
  // requests resent, and its socket replaced, after retry_interval_s
  // (resend_due). At `deadline` the sockets of every ps still holding frames
  // are replaced (closed with linger 0, which frees their queued frames; their
  // data requests go out again on the new ones) and it waits as long again.
  // Frames still held after that would be read after the caller frees its
  // buffers, so the process stops rather than return.
  void wait_for_releases(Clock::time_point deadline) {
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
        for (std::uint32_t s = 0; s < sockets.size(); ++s)
          if (frames_held[s].load() > 0) replace_socket(s);
        replaced = true;
        deadline = Clock::now() + std::max(grace, seconds(1));
      }
      poll(std::chrono::milliseconds(1));
    }
  }

  // A new DEALER for ps `server`; its data requests in flight go out again
  // on it (replies to the old socket's identity are lost).
  void replace_socket(std::uint32_t server) {
    sockets[server] = make_socket(server);
    const auto now = Clock::now();
    for (auto& [rid, r] : requests)
      if (r.server == server && !r.header.empty()) r.resend_at = now;
  }

  [[noreturn]] void timed_out(Ticket id, TicketState& t) {
    std::vector<std::uint32_t> silent;
    for (auto it = requests.begin(); it != requests.end();) {
      if (it->second.ticket != id) {
        ++it;
        continue;
      }
      if (std::ranges::find(silent, it->second.server) == silent.end())
        silent.push_back(it->second.server);
      it = requests.erase(it);
    }
    std::ranges::sort(silent);
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", t.timeout_s);
    std::string msg;
    for (auto s : silent)
      msg += (msg.empty() ? "" : "; ") + where(s) + ": no reply to " + describe(t) + " within " +
             secs + " s";
    // The silent ps may still hold our zero-copy frames in its queue; a fresh
    // socket drops them so the caller gets its buffers back.
    for (auto s : silent) replace_socket(s);
    wait_for_releases(Clock::now() + seconds(t.timeout_s));
    tickets.erase(id);
    throw PsError(msg);
  }

  void poll(Clock::duration timeout) {
    std::vector<zmq::pollitem_t> items;
    for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
    const auto ms =
        std::chrono::ceil<std::chrono::milliseconds>(std::max(timeout, Clock::duration::zero()));
    if (zmq_poll(items.data(), static_cast<int>(items.size()), static_cast<long>(ms.count())) < 0) {
      if (zmq_errno() == EINTR) return;
      throw zmq::error_t();
    }
    std::vector<zmq::message_t> frames;
    for (std::uint32_t s = 0; s < items.size(); ++s) {
      if (!(items[s].revents & ZMQ_POLLIN)) continue;
      while (true) {
        frames.clear();
        if (!zmq::recv_multipart(sockets[s], std::back_inserter(frames), zmq::recv_flags::dontwait))
          break;
        dispatch(s, frames);
      }
    }
    resend_due();
  }

  void dispatch(std::uint32_t server, std::vector<zmq::message_t>& frames) {
    Header h;
    try {
      h = wire::decode_header({frames[0].data<std::uint8_t>(), frames[0].size()});
    } catch (const wire::ProtocolError&) {
      return;  // not attributable to any request; its request will time out
    }
    note_generation(server, h.generation);
    last_heard[server] = Clock::now();
    const auto it = requests.find(h.request_id);
    if (it == requests.end()) return;  // given up on after a timeout, or a resend's twin
    const Request r = it->second;
    requests.erase(it);
    auto& t = *tickets.at(r.ticket);
    --t.replies_left;
    try {
      if (h.status == wire::Status::error) {
        const auto refusal = wire::ErrorReply::read(h);
        t.retry_after_ms = std::max(t.retry_after_ms, refusal.retry_after_ms);
        throw PsError(refusal.text);
      }
      if (h.op != t.op) throw PsError("reply is for " + std::string(wire::to_string(h.op)));
      if (frames.size() != 1 + h.payload_frames)
        throw PsError("reply declares " + std::to_string(h.payload_frames) +
                      " payload frames, it has " + std::to_string(frames.size() - 1));
      for (std::size_t i = 0; i < h.payload_frames; ++i)
        wire::check_payload(h, i, frames[1 + i].size());
      if (r.chunk) {
        take_chunk_reply(t, r, h, frames);
      } else {
        Reply reply{server, std::move(h), {}};
        if (reply.header.payload_frames == 1) {
          const auto* p = frames[1].data<std::uint8_t>();
          reply.bytes.assign(p, p + frames[1].size());
        }
        t.control.push_back(std::move(reply));
      }
    } catch (const std::exception& e) {
      if (t.error.empty()) t.error = where(server) + ": " + describe(t) + " failed: " + e.what();
    }
  }

  // Replies of a ps carry its generation; a new one means it restarted.
  // 0 (a peer that does not say) is no news.
  void note_generation(std::uint32_t server, std::uint64_t generation) {
    if (generation == 0 || generation == generations[server]) return;
    if (generations[server] != 0) generation_changed[server] = true;
    generations[server] = generation;
  }

  void take_chunk_reply(TicketState& t, const Request& r, const Header& h,
                        std::vector<zmq::message_t>& frames) {
    const auto& c = *r.chunk;
    const auto g = static_cast<std::size_t>(&c - map.all_chunks().data());
    const auto version = wire::ChunkReply::read(h).version;
    if (t.op == Op::push || t.op == Op::push_pull || t.op == Op::assign) ++acked[c.server];
    if (t.op == Op::push || t.op == Op::push_pull) {
      const auto before = version == 0 ? 0 : version - 1;
      t.staleness_sum += static_cast<double>(before - std::min(before, pulled_version[g]));
      ++t.staleness_chunks;
    }
    if (t.op == Op::pull || t.op == Op::push_pull) {
      if (h.payload_frames != 1 || h.dtype != wire_dtype || h.elements != c.count)
        throw PsError("chunk " + std::to_string(c.index) + " reply carries " +
                      std::to_string(h.elements) + " values of " +
                      std::string(wire::to_string(h.dtype)) + ", expected " +
                      std::to_string(c.count) + " of " + std::string(wire::to_string(wire_dtype)));
      const std::span<const std::uint8_t> frame(frames[1].data<std::uint8_t>(), frames[1].size());
      if (const auto half = wire::half_format(h.dtype)) {
        wire::widen(*half, frame, r.out + c.offset);
      } else {
        std::memcpy(r.out + c.offset, frame.data(), frame.size());
      }
      pulled_version[g] = version;
    }
  }
};

PsClient::PsClient(std::vector<std::string> ps_addresses, ShardMap map, std::uint64_t run_id,
                   PsClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(ps_addresses), std::move(map), run_id, options)) {}

std::vector<std::string> ps_addresses(const ClusterConfig& config) {
  std::vector<std::string> out;
  for (const auto& ps : config.ps) out.push_back(ps.connect_address());
  return out;
}

PsClientOptions client_options(const ClusterConfig& config, std::uint32_t sender) {
  std::optional<PsClientOptions::Curve> curve;
  if (config.security.curve) {
    const auto dir = keys_dir(config);
    const auto list = read_public_keys(dir);
    curve.emplace();
    curve->own = read_key_pair(dir, client_identity(config, sender));
    for (std::uint32_t s = 0; s < config.ps.size(); ++s)
      curve->server_keys.push_back(public_key_of(list, {Identity::Role::ps, s}, dir));
  }
  return {.sender = sender,
          .timeout_s = config.net.request_timeout,
          .retry_interval_s = config.net.retry_interval,
          .config_yaml = config.to_yaml(),
          .takeover_grace_s = 2 * takeover_silence(config.net),
          .wire_dtype = config.net.wire_dtype,
          .fault = config.net.fault,
          .fault_seed = config.train.seed ^ (0xc2b2ae3d27d4eb4fULL * (sender + 1)),
          .curve = std::move(curve)};
}

PsClient::PsClient(const ClusterConfig& config, std::uint32_t sender, ShardMap map)
    : PsClient(ps_addresses(config), std::move(map), config.run_id(),
               client_options(config, sender)) {}

PsClient::~PsClient() = default;

const ShardMap& PsClient::map() const { return impl_->map; }

std::vector<std::uint64_t> PsClient::hello() {
  std::vector<std::uint64_t> updates(impl_->addresses.size());
  for (std::uint32_t s = 0; s < updates.size(); ++s) updates[s] = hello(s);
  return updates;
}

std::uint64_t PsClient::hello(std::uint32_t server) {
  auto& impl = *impl_;
  std::optional<Clock::time_point> give_up;  // from the first temporary refusal
  while (true) {
    Header h;
    wire::Hello{impl.options.config_yaml, impl.acked.at(server)}.write(h);
    try {
      const auto replies = impl.control(Op::hello, {server}, std::move(h), impl.options.timeout_s);
      return wire::HelloReply::read(replies.front().header).state_updates;
    } catch (const RetryLater& refused) {
      const auto now = Clock::now();
      if (!give_up) give_up = now + Impl::seconds(impl.options.takeover_grace_s);
      if (now >= *give_up) throw;
      const auto until = std::min<Clock::time_point>(*give_up, now + refused.after);
      while (Clock::now() < until) impl.poll(until - Clock::now());
    }
  }
}

std::uint64_t PsClient::acked_updates(std::uint32_t server) const {
  return impl_->acked.at(server);
}

void PsClient::init(std::uint64_t seed) {
  auto& m = impl_->map;
  std::vector<std::vector<float>> values;  // alive until the replies are in
  values.reserve(m.all_chunks().size());
  auto [id, t] = impl_->start(Op::init, "all variables", impl_->options.timeout_s);
  for (const auto& c : m.all_chunks()) {
    const auto& var = m.variables()[c.variable];
    auto& v = values.emplace_back(c.count);
    init_fill(v, seed, var.name, c.offset, var.init);
    Header h;
    h.op = Op::init;
    wire::ChunkRequest{var.name, c.index}.write(h);
    impl_->send(id, t, {0, c.server, nullptr, nullptr}, std::move(h),
                bytes_of(std::span<const float>(v)));
  }
  impl_->finish(id, t);
}

PsClient::Ticket PsClient::pull(std::string_view variable, std::span<float> out) {
  return impl_->data_op(Op::pull, variable, {}, out, out.size());
}

PsClient::Ticket PsClient::push(std::string_view variable, std::span<const float> grad) {
  return impl_->data_op(Op::push, variable, grad, {}, grad.size());
}

PsClient::Ticket PsClient::push_pull(std::string_view variable, std::span<const float> grad,
                                     std::span<float> out) {
  if (grad.size() != out.size())
    throw std::invalid_argument("ps client: push_pull of '" + std::string(variable) +
                                "': " + std::to_string(grad.size()) + " gradients but " +
                                std::to_string(out.size()) + " output floats");
  return impl_->data_op(Op::push_pull, variable, grad, out, grad.size());
}

PsClient::Ticket PsClient::assign(std::string_view variable, std::span<const float> values) {
  return impl_->data_op(Op::assign, variable, values, {}, values.size());
}

void PsClient::set_clock(std::uint64_t steps_done) { impl_->clock = steps_done; }

void PsClient::wait(Ticket ticket) { impl_->wait(ticket); }

std::uint64_t PsClient::generation(std::uint32_t server) const {
  return impl_->generations.at(server);
}

bool PsClient::take_generation_change(std::uint32_t server) {
  auto& changed = impl_->generation_changed;
  const bool was = changed.at(server);
  changed[server] = false;
  return was;
}

void PsClient::wait_all() {
  while (!impl_->tickets.empty()) impl_->wait(impl_->tickets.begin()->first);
}

void PsClient::abandon_all() {
  auto& impl = *impl_;
  impl.requests.clear();  // their replies are dropped on arrival (dispatch)
  for (std::uint32_t s = 0; s < impl.sockets.size(); ++s)
    if (impl.frames_held[s].load() > 0) impl.replace_socket(s);
  // Payloads in a ticket's own memory (rounded gradients) go with it.
  impl.wait_for_releases(Clock::now() + Impl::seconds(impl.options.timeout_s));
  impl.tickets.clear();
}

double PsClient::last_staleness(std::string_view variable) const {
  return impl_->staleness[impl_->variable_index(variable)];
}

void PsClient::barrier(const std::string& name, std::uint32_t count,
                       const std::function<void(std::uint64_t)>& while_waiting) {
  Header h;
  h.op = Op::barrier;
  wire::Barrier{name, count}.write(h);
  auto& impl = *impl_;
  // A barrier may wait far longer than any request timeout (the slowest
  // worker decides), so it has none of its own: while it waits, heartbeats
  // keep this worker alive in every ps's eyes, and a ps that stops answering
  // them ends the wait with an error naming it.
  auto [id, t] = impl.start(Op::barrier, name, impl.options.timeout_s);
  impl.send(id, t, {0, 0, nullptr, nullptr}, std::move(h), {});
  const auto interval = Impl::seconds(std::min(1.0, impl.options.timeout_s / 4));
  while (t.replies_left > 0) {
    impl.poll(interval);
    if (t.replies_left == 0) break;
    const auto global = heartbeat(0);
    if (while_waiting) while_waiting(global);
  }
  impl.finish(id, t);
}

std::uint64_t PsClient::heartbeat(std::uint64_t samples_since_last) {
  Header h;
  wire::Heartbeat{samples_since_last}.write(h);
  const auto replies =
      impl_->control(Op::heartbeat, impl_->all_servers(), std::move(h), impl_->options.timeout_s);
  return wire::GlobalSamples::read(replies.front().header).global_samples;
}

void PsClient::finished_pushing() {
  Header h;
  wire::Heartbeat{0, true}.write(h);
  impl_->control(Op::heartbeat, impl_->all_servers(), std::move(h), impl_->options.timeout_s);
}

std::pair<std::uint64_t, std::uint64_t> PsClient::heartbeat_ps0(std::uint64_t samples) {
  Header h;
  wire::Heartbeat{samples}.write(h);
  const auto replies = impl_->control(Op::heartbeat, {0}, std::move(h), impl_->options.timeout_s);
  const auto counted = wire::GlobalSamples::read(replies.front().header);
  return {counted.global_samples, counted.sender_samples};
}

std::uint64_t PsClient::report_samples(std::uint64_t samples_since_last) {
  return heartbeat_ps0(samples_since_last).first;
}

std::uint64_t PsClient::samples_counted() { return heartbeat_ps0(0).second; }

void PsClient::done(std::uint64_t total_samples) {
  Header h;
  wire::Done{total_samples}.write(h);
  impl_->control(Op::done, impl_->all_servers(), std::move(h), impl_->options.timeout_s);
}

void PsClient::kv_set(const std::string& key, std::span<const std::uint8_t> value) {
  Header h;
  wire::KvSet{wire::kv_key(impl_->options.sender, key)}.write(h);
  h.dtype = wire::DType::bytes;
  impl_->control(Op::kv_set, {0}, std::move(h), impl_->options.timeout_s, value);
}

std::vector<std::uint8_t> PsClient::kv_get(std::uint32_t writer, const std::string& key,
                                           double timeout_s) {
  if (!(timeout_s >= 0))
    throw std::invalid_argument("ps client: kv_get of '" + key + "': timeout of " +
                                std::to_string(timeout_s) + " s");
  // Whole milliseconds on the wire; a wait too long to count is the ps's to refuse.
  const double ms = std::round(timeout_s * 1000);
  Header h;
  wire::KvGet{wire::kv_key(writer, key), ms < 0x1p64 ? static_cast<std::uint64_t>(ms) : UINT64_MAX}
      .write(h);
  auto replies =
      impl_->control(Op::kv_get, {0}, std::move(h), timeout_s + impl_->options.timeout_s);
  return std::move(replies.front().bytes);
}

std::string PsClient::snapshot(std::uint32_t server) {
  const auto replies = impl_->control(Op::snapshot, {server}, {}, impl_->options.timeout_s);
  return wire::SnapshotReply::read(replies.front().header).path;
}

std::string PsClient::stats(std::uint32_t server) {
  const auto replies = impl_->control(Op::stats, {server}, {}, impl_->options.timeout_s);
  return wire::StatsReply::read(replies.front().header).json;
}

void PsClient::shutdown(std::uint32_t server) {
  impl_->control(Op::shutdown, {server}, {}, impl_->options.timeout_s);
}

}  // namespace pstrain
