#include "server/ps_role.h"

#include <array>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "server/chunk_store.h"
#include "shared/snapshot.h"
#include "shared/log.h"
#include "shared/protocol.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;
using wire::Header;
using wire::Op;

// Set from the signal handler; the request loop wakes at least every
// kPollInterval to look at it.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
constexpr auto kPollInterval = std::chrono::milliseconds(100);

// Installs the stop handlers for the lifetime of the server and puts the
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

// A reply frame over a chunk's value buffer: ZeroMQ sends straight from it
// and drops the reference once the bytes are on the wire, which is what lets
// the store see whether a pull still holds the buffer (copy-on-write).
zmq::message_t zero_copy(const ValueBuffer& values) {
  auto ref = std::make_unique<ValueBuffer>(values);
  zmq::message_t msg(
      values->data(), values->size() * sizeof(float),
      [](void*, void* hint) { std::unique_ptr<ValueBuffer> owned(static_cast<ValueBuffer*>(hint)); },
      ref.get());
  ref.release();  // owned by the message's free function from here on
  return msg;
}

// The float payload of a request, read in place when ZeroMQ's buffer is
// suitably aligned (it is for every frame but the tiny inline ones).
class FloatPayload {
 public:
  explicit FloatPayload(const zmq::message_t& frame) {
    const auto n = frame.size() / sizeof(float);
    if (reinterpret_cast<std::uintptr_t>(frame.data()) % alignof(float) == 0) {
      view_ = {static_cast<const float*>(frame.data()), n};
    } else {
      copy_.resize(n);
      std::memcpy(copy_.data(), frame.data(), n * sizeof(float));
      view_ = copy_;
    }
  }
  std::span<const float> get() const { return view_; }

 private:
  std::vector<float> copy_;
  std::span<const float> view_;
};

class PsServer {
 public:
  PsServer(const ClusterConfig& config, std::uint32_t index)
      : config_(config),
        index_(index),
        run_id_(config.hash()),
        config_yaml_(config.to_yaml()),
        store_(config.optimizer),
        socket_(context_, zmq::socket_type::router),
        heard_(config.workers.size()),
        done_(config.workers.size(), false),
        started_(Clock::now()) {
    socket_.set(zmq::sockopt::sndhwm, 0);
    socket_.set(zmq::sockopt::rcvhwm, 0);
    // Replies to `done` and `shutdown` are the last messages; let them leave.
    socket_.set(zmq::sockopt::linger, 2000);
  }

  void restore(const std::filesystem::path& dir) {
    // The shard map depends on the number of servers: a snapshot of another
    // layout would restore some chunks and leave others to be created fresh.
    std::size_t files = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const auto name = entry.path().filename().string();
      if (name.starts_with("ps") && name.ends_with(".bin")) ++files;
    }
    if (!ec && files != config_.ps.size())
      throw SnapshotError("snapshot " + dir.string() + " holds " + std::to_string(files) +
                          " ps files, this cluster has " + std::to_string(config_.ps.size()) +
                          " parameter servers; restore with the same ps list");
    const auto file = dir / ("ps" + std::to_string(index_) + ".bin");
    auto snap = read_snapshot(file);
    try {
      store_.restore(std::move(snap.records));
    } catch (const std::invalid_argument& e) {
      throw SnapshotError("snapshot " + file.string() + ": " + e.what());
    }
    global_samples_ = snap.global_samples;
    log("restored ", store_.size(), " chunks (", store_.elements(),
        " values) and ", global_samples_, " global samples from ", file.string());
  }

  void bind() {
    const auto address = config_.ps.at(index_).bind_address();
    socket_.bind(address);
    log("serving on ", address, " (", config_.workers.size(), " workers, optimizer ",
        to_string(config_.optimizer.kind), ")");
  }

  int run() {
    while (!exit_code_) {
      if (g_stop_signal) {
        log("stopping on signal ", static_cast<int>(g_stop_signal));
        return 0;
      }
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      const auto rc = zmq_poll(&item, 1, static_cast<long>(poll_timeout().count()));
      if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
      if (rc > 0) drain();
      expire_kv_gets();
      check_worker_timeout();
    }
    return *exit_code_;
  }

 private:
  std::string prefix() const { return "ps " + std::to_string(index_) + ": "; }

  std::chrono::milliseconds poll_timeout() const {
    auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kPollInterval);
    const auto now = Clock::now();
    for (const auto& g : kv_waiting_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(g.deadline - now);
      timeout = std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(0),
                           timeout);
    }
    return timeout;
  }

  // Handles the requests that have arrived, without blocking, at most a
  // batch at a time so that signals, kv_get deadlines and worker timeouts
  // are checked under steady traffic too.
  void drain() {
    constexpr int kBatch = 256;
    std::vector<zmq::message_t> frames;
    for (int n = 0; n < kBatch && !exit_code_; ++n) {
      frames.clear();
      if (!zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait))
        return;
      for (const auto& f : frames) bytes_in_ += f.size();
      handle(frames);
    }
  }

  void handle(std::vector<zmq::message_t>& frames) {
    zmq::message_t& identity = frames[0];
    if (frames.size() < 2) {
      ++malformed_;
      send(identity, bad_header_reply("message has no header frame"), {});
      return;
    }
    Header request;
    try {
      request = wire::decode_header({frames[1].data<std::uint8_t>(), frames[1].size()});
    } catch (const wire::ProtocolError& e) {
      ++malformed_;
      send(identity, bad_header_reply(std::string("bad header: ") + e.what()), {});
      return;
    }
    ++requests_[static_cast<std::size_t>(request.op)];
    try {
      dispatch(identity, request, frames);
    } catch (const std::exception& e) {
      ++errors_;
      send(identity, wire::error_reply(request, prefix() + describe(request) + ": " + e.what()),
           {});
    }
  }

  static std::string describe(const Header& request) {
    std::string s(wire::to_string(request.op));
    switch (request.op) {
      case Op::init:
      case Op::pull:
      case Op::push:
      case Op::push_pull:
      case Op::assign:
        return s + " of '" + request.variable + "' chunk " + std::to_string(request.chunk);
      default:
        return request.variable.empty() ? s : s + " '" + request.variable + "'";
    }
  }

  static Header bad_header_reply(std::string text) {
    Header h;
    h.status = wire::Status::error;
    h.text = std::move(text);
    return h;
  }

  void check_request(const Header& request, const std::vector<zmq::message_t>& frames) const {
    if (request.protocol != wire::kProtocolVersion)
      throw wire::ProtocolError("protocol version differs: ps speaks " +
                                std::to_string(wire::kProtocolVersion) + ", sender " +
                                std::to_string(request.sender) + " speaks " +
                                std::to_string(request.protocol));
    if (request.run_id != run_id_) {
      std::string which;
      if (request.op == Op::hello && !request.text.empty())
        which = " (ps vs sender: " + config_differences(config_yaml_, request.text) + ")";
      throw wire::ProtocolError("config hash differs: ps has " + hex(run_id_) + ", sender " +
                                std::to_string(request.sender) + " sent " +
                                hex(request.run_id) + which +
                                " — all processes must use the same cluster.yaml and --set "
                                "overrides");
    }
    if (frames.size() != 2 + request.payload_frames)
      throw wire::ProtocolError("header declares " + std::to_string(request.payload_frames) +
                                " payload frames, the message has " +
                                std::to_string(frames.size() - 2));
    for (std::size_t i = 0; i < request.payload_frames; ++i)
      wire::check_payload(request, i, frames[2 + i].size());
  }

  // The request's single payload of the given type.
  static const zmq::message_t& payload(const Header& request,
                                       const std::vector<zmq::message_t>& frames,
                                       wire::DType type) {
    if (request.payload_frames != 1 || request.dtype != type)
      throw wire::ProtocolError(std::string(wire::to_string(request.op)) +
                                " needs one payload frame of " +
                                (type == wire::DType::f32 ? "f32" : "bytes"));
    return frames[2];
  }

  void dispatch(zmq::message_t& identity, const Header& request,
                std::vector<zmq::message_t>& frames) {
    check_request(request, frames);
    note_sender(request.sender);
    Header reply = wire::reply_to(request);
    reply.run_id = run_id_;
    switch (request.op) {
      case Op::hello:
        reply.run_id = 0;
        reply.count = config_.workers.size();
        break;
      case Op::init: {
        FloatPayload values(payload(request, frames, wire::DType::f32));
        store_.init(request.variable, request.chunk, values.get());
        reply.version = store_.find(request.variable, request.chunk)->version;
        break;
      }
      case Op::pull: {
        const Chunk* c = store_.find(request.variable, request.chunk);
        if (!c) throw std::invalid_argument("unknown chunk (not initialized on this ps)");
        return send_values(identity, std::move(reply), *c);
      }
      case Op::push:
      case Op::push_pull: {
        FloatPayload grad(payload(request, frames, wire::DType::f32));
        const Chunk& c = store_.push(request.variable, request.chunk, grad.get());
        if (request.op == Op::push_pull) return send_values(identity, std::move(reply), c);
        reply.version = c.version;
        break;
      }
      case Op::assign: {
        FloatPayload values(payload(request, frames, wire::DType::f32));
        reply.version = store_.assign(request.variable, request.chunk, values.get()).version;
        break;
      }
      case Op::barrier:
        return enter_barrier(identity, request);
      case Op::snapshot:
        reply.text = write_snapshot_file();
        break;
      case Op::stats:
        reply.text = stats_json();
        break;
      case Op::shutdown:
        log("shutdown requested by sender ", request.sender);
        exit_code_ = 0;
        break;
      case Op::kv_set: {
        const auto& value = payload(request, frames, wire::DType::bytes);
        const auto* bytes = value.data<std::uint8_t>();
        kv_[request.variable].assign(bytes, bytes + value.size());
        send(identity, std::move(reply), {});
        return answer_kv_gets(request.variable);
      }
      case Op::kv_get:
        return get_kv(identity, request);
      case Op::heartbeat:
        // Only workers train samples; a count that would wrap the total is
        // not one a worker can have trained.
        if (request.sender >= done_.size())
          throw std::invalid_argument("heartbeat from sender " + std::to_string(request.sender) +
                                      ", which is not a worker");
        if (request.count > UINT64_MAX - global_samples_)
          throw std::invalid_argument("heartbeat count " + std::to_string(request.count) +
                                      " overflows the global sample count");
        global_samples_ += request.count;
        reply.version = global_samples_;
        break;
      case Op::done:
        finish_worker(request);
        reply.version = global_samples_;
        break;
    }
    send(identity, std::move(reply), {});
  }

  void send_values(zmq::message_t& identity, Header reply, const Chunk& c) {
    reply.version = c.version;
    reply.dtype = wire::DType::f32;
    reply.count = c.values->size();
    reply.payload_frames = 1;
    std::array<zmq::message_t, 1> payload{zero_copy(c.values)};
    send(identity, std::move(reply), payload);
  }

  void send(const zmq::message_t& identity, const Header& reply,
            std::span<zmq::message_t> payload) {
    const auto header = wire::encode_header(reply);
    zmq::message_t id(identity.data(), identity.size());
    bytes_out_ += header.size();
    socket_.send(id, zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(header),
                 payload.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (std::size_t i = 0; i < payload.size(); ++i) {
      bytes_out_ += payload[i].size();
      socket_.send(payload[i], i + 1 == payload.size() ? zmq::send_flags::none
                                                       : zmq::send_flags::sndmore);
    }
  }

  // A request parked until something else happens (barrier, kv_get).
  struct Parked {
    zmq::message_t identity;
    Header request;
    Clock::time_point deadline{};
  };

  struct Barrier {
    std::uint64_t count = 0;
    std::set<std::uint32_t> senders;
    std::vector<Parked> waiting;
  };

  void enter_barrier(zmq::message_t& identity, const Header& request) {
    if (request.count == 0) throw std::invalid_argument("barrier count must be at least 1");
    auto& b = barriers_[request.variable];
    if (b.waiting.empty()) b.count = request.count;
    if (b.count != request.count)
      throw std::invalid_argument("barrier '" + request.variable + "' was entered with count " +
                                  std::to_string(b.count) + ", this request says " +
                                  std::to_string(request.count));
    b.senders.insert(request.sender);
    b.waiting.push_back({std::move(identity), request});
    if (b.senders.size() < b.count) return;
    auto released = std::move(b.waiting);
    barriers_.erase(request.variable);
    for (auto& p : released) {
      Header reply = wire::reply_to(p.request);
      reply.run_id = run_id_;
      reply.count = released.size();
      send(p.identity, reply, {});
    }
  }

  void get_kv(zmq::message_t& identity, const Header& request) {
    double timeout_s = 0;
    const auto* end = request.text.data() + request.text.size();
    const auto [ptr, ec] = std::from_chars(request.text.data(), end, timeout_s);
    if (ec != std::errc() || ptr != end || !(timeout_s >= 0) || timeout_s > 86400)
      throw std::invalid_argument("kv_get timeout '" + request.text +
                                  "' is not a number of seconds in [0, 86400]");
    if (kv_.count(request.variable)) return send_kv(identity, request);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    kv_waiting_.push_back({std::move(identity), request, deadline});
  }

  void send_kv(const zmq::message_t& identity, const Header& request) {
    const auto& value = kv_.at(request.variable);
    Header reply = wire::reply_to(request);
    reply.run_id = run_id_;
    reply.dtype = wire::DType::bytes;
    reply.count = value.size();
    reply.payload_frames = 1;
    std::array<zmq::message_t, 1> payload{zmq::message_t(value.data(), value.size())};
    send(identity, reply, payload);
  }

  void answer_kv_gets(const std::string& key) {
    std::erase_if(kv_waiting_, [&](Parked& p) {
      if (p.request.variable != key) return false;
      send_kv(p.identity, p.request);
      return true;
    });
  }

  void expire_kv_gets() {
    const auto now = Clock::now();
    std::erase_if(kv_waiting_, [&](Parked& p) {
      if (now < p.deadline) return false;
      send(p.identity,
           wire::error_reply(p.request, prefix() + "kv_get '" + p.request.variable +
                                            "': not set within " + p.request.text + " s"),
           {});
      return true;
    });
  }

  void note_sender(std::uint32_t sender) {
    if (sender >= heard_.size()) return;  // tools and benchmarks are not workers
    const auto now = Clock::now();
    heard_[sender] = now;
    if (!first_heard_) first_heard_ = now;
  }

  void finish_worker(const Header& request) {
    if (request.sender >= done_.size())
      throw std::invalid_argument("sender " + std::to_string(request.sender) +
                                  " is not a worker (the cluster has " +
                                  std::to_string(done_.size()) + ")");
    if (!done_[request.sender])
      log("worker ", request.sender, " done after ", request.count, " samples");
    done_[request.sender] = true;
    if (std::ranges::all_of(done_, [](bool d) { return d; })) {
      log("all ", done_.size(), " workers done; exiting");
      exit_code_ = 0;
    }
  }

  void check_worker_timeout() {
    if (!first_heard_ || exit_code_) return;
    const auto now = Clock::now();
    const std::chrono::duration<double> limit(config_.net.worker_timeout);
    std::string silent;
    for (std::size_t w = 0; w < heard_.size(); ++w) {
      if (done_[w]) continue;
      const auto last = heard_[w] ? *heard_[w] : *first_heard_;
      if (now - last >= limit) silent += (silent.empty() ? "" : ", ") + std::to_string(w);
    }
    if (silent.empty()) return;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", config_.net.worker_timeout);
    const std::string reason = "no message from worker(s) " + silent + " for " + seconds +
                               " s (net.worker_timeout)";
    log(reason, "; exiting");
    // Workers parked in a barrier or kv_get learn why instead of timing out.
    for (auto& [name, b] : barriers_)
      for (auto& p : b.waiting) send(p.identity, wire::error_reply(p.request, prefix() + reason), {});
    for (auto& p : kv_waiting_) send(p.identity, wire::error_reply(p.request, prefix() + reason), {});
    barriers_.clear();
    kv_waiting_.clear();
    exit_code_ = 3;
  }

  std::string write_snapshot_file() {
    const auto path =
        config_.run_dir / "snapshot" / ("ps" + std::to_string(index_) + ".bin");
    write_snapshot(path, {global_samples_, store_.records()});
    log("snapshot of ", store_.size(), " chunks written to ", path.string());
    return path.string();
  }

  std::string stats_json() const {
    std::ostringstream j;
    j << "{\"ps\":" << index_ << ",\"requests\":{";
    for (std::uint8_t op = 1; op <= wire::kMaxOp; ++op)
      j << (op > 1 ? "," : "") << '"' << wire::to_string(static_cast<Op>(op))
        << "\":" << requests_[op];
    const auto& s = store_.stats();
    j << "},\"errors\":" << errors_ << ",\"malformed\":" << malformed_
      << ",\"bytes_in\":" << bytes_in_ << ",\"bytes_out\":" << bytes_out_
      << ",\"optimizer_seconds\":" << s.optimizer_seconds << ",\"updates\":" << s.updates
      << ",\"copies_on_write\":" << s.copies_on_write << ",\"chunks\":" << store_.size()
      << ",\"elements\":" << store_.elements() << ",\"version_sum\":" << store_.version_sum()
      << ",\"version_max\":" << store_.version_max()
      << ",\"global_samples\":" << global_samples_ << ",\"uptime_seconds\":"
      << std::chrono::duration<double>(Clock::now() - started_).count() << "}";
    return j.str();
  }

  const ClusterConfig& config_;
  std::uint32_t index_;
  std::uint64_t run_id_;
  std::string config_yaml_;
  ChunkStore store_;
  zmq::context_t context_;
  zmq::socket_t socket_;

  std::map<std::string, Barrier> barriers_;
  std::map<std::string, std::vector<std::uint8_t>> kv_;
  std::vector<Parked> kv_waiting_;

  std::vector<std::optional<Clock::time_point>> heard_;
  std::vector<bool> done_;
  std::optional<Clock::time_point> first_heard_;
  std::uint64_t global_samples_ = 0;
  std::optional<int> exit_code_;

  std::array<std::uint64_t, wire::kMaxOp + 1> requests_{};
  std::uint64_t errors_ = 0;
  std::uint64_t malformed_ = 0;
  std::uint64_t bytes_in_ = 0;
  std::uint64_t bytes_out_ = 0;
  Clock::time_point started_;
};

}  // namespace

int run_ps_role(const ClusterConfig& config, std::uint32_t index,
                const std::optional<std::filesystem::path>& restore_dir) {
  if (index >= config.ps.size()) {
    log("no ps ", index, " in the cluster (it has ", config.ps.size(), ")");
    return 2;
  }
  StopSignals signals;
  try {
    PsServer server(config, index);
    if (restore_dir) server.restore(*restore_dir);
    server.bind();
    try {
      return server.run();
    } catch (const zmq::error_t& e) {
      log("network error while serving on ", config.ps[index].bind_address(), ": ", e.what());
      return 1;
    }
  } catch (const SnapshotError& e) {
    log("cannot restore: ", e.what());
  } catch (const zmq::error_t& e) {
    log("cannot serve on ", config.ps[index].bind_address(), ": ", e.what());
  }
  return 2;
}

}  // namespace pstrain
