#include "client/ps_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "shared/init.h"
#include "shared/messages.h"

namespace pstrain {

using wire::Header;
using wire::Op;
using Clock = std::chrono::steady_clock;

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
    std::string label;           // variable or key, for error messages
    double timeout_s = 0;
    std::size_t replies_left = 0;
    std::string error;
    double staleness_sum = 0;
    std::size_t staleness_chunks = 0;
    std::vector<Reply> control;  // replies of control operations
  };

  struct Request {
    Ticket ticket = 0;
    std::uint32_t server = 0;
    const ChunkRef* chunk = nullptr;  // data operations
    float* out = nullptr;             // where pulled values of the variable go
  };

  // Zero-copy frames ZeroMQ has not released yet, over all tickets:
  // decremented from ZeroMQ's I/O thread, hence atomic. It belongs to the
  // client rather than a ticket, whose state may be gone by the time the I/O
  // thread notifies; declared before the context, which releases the last
  // frames when it terminates.
  std::atomic<std::uint64_t> sends_in_flight{0};
  std::unordered_map<Ticket, std::unique_ptr<TicketState>> tickets;
  std::unordered_map<std::uint64_t, Request> requests;
  std::vector<std::string> addresses;
  ShardMap map;
  std::uint64_t run_id;
  PsClientOptions options;
  std::vector<std::uint64_t> pulled_version;  // per chunk of map.all_chunks()
  std::vector<double> staleness;              // per variable
  std::uint64_t next_request = 1;
  Ticket next_ticket = 1;
  zmq::context_t context;
  std::vector<zmq::socket_t> sockets;

  Impl(std::vector<std::string> ps_addresses, ShardMap shard_map, std::uint64_t run,
       PsClientOptions opts)
      : addresses(std::move(ps_addresses)),
        map(std::move(shard_map)),
        run_id(run),
        options(opts),
        pulled_version(map.all_chunks().size(), 0),
        staleness(map.variables().size(), 0.0),
        context(1) {
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
    auto& in_flight = static_cast<Impl*>(hint)->sends_in_flight;
    in_flight.fetch_sub(1);
    in_flight.notify_all();
  }

  // Sends one request; `floats` go out zero-copy from the caller's buffer,
  // `bytes` (small control payloads) are copied.
  void send(Ticket id, TicketState& t, Request r, Header h, std::span<const float> floats,
            std::span<const std::uint8_t> bytes = {}) {
    h.request_id = next_request++;
    h.sender = options.sender;
    h.run_id = run_id;
    const bool has_payload = !floats.empty() || h.dtype == wire::DType::bytes;
    if (has_payload) {
      h.payload_frames = 1;
      h.elements = floats.empty() ? bytes.size() : floats.size();
    }
    const auto header = wire::encode_header(h);
    auto& socket = sockets[r.server];
    socket.send(zmq::buffer(header), has_payload ? zmq::send_flags::sndmore
                                                 : zmq::send_flags::none);
    if (!floats.empty()) {
      sends_in_flight.fetch_add(1);
      zmq::message_t payload(const_cast<float*>(floats.data()), floats.size_bytes(),
                             &Impl::release_send, this);
      socket.send(payload, zmq::send_flags::none);
    } else if (has_payload) {
      socket.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
    }
    r.ticket = id;
    requests.emplace(h.request_id, r);
    ++t.replies_left;
  }

  Ticket data_op(Op op, std::string_view name, std::span<const float> grad,
                 std::span<float> out, std::size_t given) {
    const auto v = variable_index(name);
    const auto size = map.variables()[v].size;
    if (given != size)
      throw std::invalid_argument("ps client: " + std::string(wire::to_string(op)) + " of '" +
                                  std::string(name) + "': buffer of " + std::to_string(given) +
                                  " floats, the variable has " + std::to_string(size));
    auto [id, t] = start(op, std::string(name), options.timeout_s);
    t.variable = v;
    for (const auto& c : map.chunks(v)) {
      Header h;
      h.op = op;
      wire::ChunkRequest{map.variables()[v].name, c.index}.write(h);
      const auto payload = grad.empty() ? grad : grad.subspan(c.offset, c.count);
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
      poll(deadline - Clock::now());
      if (t.replies_left < before) {
        deadline = Clock::now() + seconds(t.timeout_s);
      } else if (Clock::now() >= deadline) {
        timed_out(id, t);
      }
    }
    // Every caller buffer ZeroMQ still reads from is released before a call
    // returns, and before an error leaves the client: the caller may free
    // buffers of other calls while unwinding.
    wait_for_releases();
    if (t.variable != kNoVariable && t.staleness_chunks > 0)
      staleness[t.variable] = t.staleness_sum / static_cast<double>(t.staleness_chunks);
    auto error = std::move(t.error);
    auto replies = std::move(t.control);
    tickets.erase(id);
    if (!error.empty()) throw PsError(error);
    return replies;
  }

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  void wait_for_releases() {
    for (auto n = sends_in_flight.load(); n != 0; n = sends_in_flight.load())
      sends_in_flight.wait(n);
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
      msg += (msg.empty() ? "" : "; ") + where(s) + ": no reply to " +
             describe(t) + " within " + secs + " s";
    // The silent ps may still hold our zero-copy frames in its queue; a fresh
    // socket drops them so the caller gets its buffers back.
    for (auto s : silent) sockets[s] = make_socket(s);
    wait_for_releases();
    tickets.erase(id);
    throw PsError(msg);
  }

  void poll(Clock::duration timeout) {
    std::vector<zmq::pollitem_t> items;
    for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(
        std::max(timeout, Clock::duration::zero()));
    if (zmq_poll(items.data(), static_cast<int>(items.size()), static_cast<long>(ms.count())) < 0) {
      if (zmq_errno() == EINTR) return;
      throw zmq::error_t();
    }
    std::vector<zmq::message_t> frames;
    for (std::uint32_t s = 0; s < items.size(); ++s) {
      if (!(items[s].revents & ZMQ_POLLIN)) continue;
      while (true) {
        frames.clear();
        if (!zmq::recv_multipart(sockets[s], std::back_inserter(frames),
                                 zmq::recv_flags::dontwait))
          break;
        dispatch(s, frames);
      }
    }
  }

  void dispatch(std::uint32_t server, std::vector<zmq::message_t>& frames) {
    Header h;
    try {
      h = wire::decode_header({frames[0].data<std::uint8_t>(), frames[0].size()});
    } catch (const wire::ProtocolError&) {
      return;  // not attributable to any request; its request will time out
    }
    const auto it = requests.find(h.request_id);
    if (it == requests.end()) return;  // a request given up on after a timeout
    const Request r = it->second;
    requests.erase(it);
    auto& t = *tickets.at(r.ticket);
    --t.replies_left;
    try {
      if (h.status == wire::Status::error) throw PsError(wire::ErrorReply::read(h).text);
      if (h.op != t.op)
        throw PsError("reply is for " + std::string(wire::to_string(h.op)));
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
      if (t.error.empty())
        t.error = where(server) + ": " + describe(t) + " failed: " + e.what();
    }
  }

  void take_chunk_reply(TicketState& t, const Request& r, const Header& h,
                        std::vector<zmq::message_t>& frames) {
    const auto& c = *r.chunk;
    const auto g = static_cast<std::size_t>(&c - map.all_chunks().data());
    const auto version = wire::ChunkReply::read(h).version;
    if (t.op == Op::push || t.op == Op::push_pull) {
      const auto before = version == 0 ? 0 : version - 1;
      t.staleness_sum += static_cast<double>(before - std::min(before, pulled_version[g]));
      ++t.staleness_chunks;
    }
    if (t.op == Op::pull || t.op == Op::push_pull) {
      if (h.payload_frames != 1 || h.dtype != wire::DType::f32 || h.elements != c.count)
        throw PsError("chunk " + std::to_string(c.index) + " reply carries " +
                      std::to_string(h.elements) + " values, expected " + std::to_string(c.count));
      std::memcpy(r.out + c.offset, frames[1].data(), frames[1].size());
      pulled_version[g] = version;
    }
  }
};

PsClient::PsClient(std::vector<std::string> ps_addresses, ShardMap map, std::uint64_t run_id,
                   PsClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(ps_addresses), std::move(map), run_id, options)) {}

namespace {
std::vector<std::string> connect_addresses(const ClusterConfig& config) {
  std::vector<std::string> out;
  for (const auto& ps : config.ps) out.push_back(ps.connect_address());
  return out;
}
}  // namespace

PsClient::PsClient(const ClusterConfig& config, std::uint32_t sender, ShardMap map)
    : PsClient(connect_addresses(config), std::move(map), config.hash(),
               PsClientOptions{sender, config.net.request_timeout, config.to_yaml()}) {}

PsClient::~PsClient() = default;

const ShardMap& PsClient::map() const { return impl_->map; }

void PsClient::hello() {
  Header h;
  wire::Hello{impl_->options.config_yaml}.write(h);
  impl_->control(Op::hello, impl_->all_servers(), std::move(h), impl_->options.timeout_s);
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
    impl_->send(id, t, {0, c.server, nullptr, nullptr}, std::move(h), v);
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
    throw std::invalid_argument("ps client: push_pull of '" + std::string(variable) + "': " +
                                std::to_string(grad.size()) + " gradients but " +
                                std::to_string(out.size()) + " output floats");
  return impl_->data_op(Op::push_pull, variable, grad, out, grad.size());
}

PsClient::Ticket PsClient::assign(std::string_view variable, std::span<const float> values) {
  return impl_->data_op(Op::assign, variable, values, {}, values.size());
}

void PsClient::wait(Ticket ticket) { impl_->wait(ticket); }

void PsClient::wait_all() {
  while (!impl_->tickets.empty()) impl_->wait(impl_->tickets.begin()->first);
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

void PsClient::done(std::uint64_t total_samples) {
  Header h;
  wire::Done{total_samples}.write(h);
  impl_->control(Op::done, impl_->all_servers(), std::move(h), impl_->options.timeout_s);
}

void PsClient::kv_set(const std::string& key, std::span<const std::uint8_t> value) {
  Header h;
  wire::KvSet{key}.write(h);
  h.dtype = wire::DType::bytes;
  impl_->control(Op::kv_set, {0}, std::move(h), impl_->options.timeout_s, value);
}

std::vector<std::uint8_t> PsClient::kv_get(const std::string& key, double timeout_s) {
  if (!(timeout_s >= 0))
    throw std::invalid_argument("ps client: kv_get of '" + key + "': timeout of " +
                                std::to_string(timeout_s) + " s");
  // Whole milliseconds on the wire; a wait too long to count is the ps's to refuse.
  const double ms = std::round(timeout_s * 1000);
  Header h;
  wire::KvGet{key, ms < 0x1p64 ? static_cast<std::uint64_t>(ms) : UINT64_MAX}.write(h);
  auto replies = impl_->control(Op::kv_get, {0}, std::move(h),
                                timeout_s + impl_->options.timeout_s);
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
