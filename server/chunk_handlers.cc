#include "server/chunk_handlers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "server/chunk_replies.h"
#include "server/shard_file.h"
#include "shared/log.h"
#include "shared/messages.h"

namespace pstrain::ps {
namespace {

using wire::Op;

// Senders logged by name at their first refused update; a peer cycling
// through made-up sender ids cannot grow the set beyond this.
constexpr std::size_t kMaxLoggedPoisoners = 1024;

// The float payload of a request: an f32 frame read in place when suitably
// aligned (ZeroMQ's buffers are, for every frame but the tiny inline ones),
// else copied; a bf16 or fp16 frame (push and push_pull, net.wire_dtype)
// widened to f32, so the optimizer and the stored values only see f32.
class FloatPayload {
 public:
  FloatPayload(const Request& request, bool halves_allowed) {
    const auto type = request.header.dtype;
    const auto half = wire::half_format(type);
    if (!wire::is_float(type) || (half && !halves_allowed))
      throw wire::ProtocolError(std::string(wire::to_string(request.header.op)) +
                                " carries values as " +
                                (halves_allowed ? "f32, bf16 or fp16" : "f32 (stored exactly)") +
                                ", not " + std::string(wire::to_string(type)));
    const auto bytes = request.payload_of(type);
    if (half) {
      copy_.resize(bytes.size() / sizeof(std::uint16_t));
      wire::widen(*half, bytes, copy_.data());
      view_ = copy_;
      return;
    }
    const auto n = bytes.size() / sizeof(float);
    if (reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(float) == 0) {
      view_ = {reinterpret_cast<const float*>(bytes.data()), n};
    } else {
      copy_.resize(n);
      // An empty vector's data() may be null, which memcpy must not get
      // even for 0 bytes.
      if (n > 0) std::memcpy(copy_.data(), bytes.data(), n * sizeof(float));
      view_ = copy_;
    }
  }
  std::span<const float> get() const { return view_; }

 private:
  std::vector<float> copy_;
  std::span<const float> view_;
};

}  // namespace

ChunkHandlers::ChunkHandlers(ChunkStore& store, Coordinator& coordinator, ReplySink& sink,
                             PsStats& stats, std::filesystem::path run_dir, std::uint32_t ps_index,
                             std::uint64_t config_hash, const Consistency& consistency)
    : store_(store),
      coordinator_(coordinator),
      sink_(sink),
      stats_(stats),
      run_dir_(std::move(run_dir)),
      ps_index_(ps_index),
      config_hash_(config_hash),
      policy_(make_policy(consistency, {store, coordinator, sink, stats})) {}

void ChunkHandlers::add_handlers(Handlers& handlers) {
  handlers.on(Op::init, [this](const Request& r) { init(r); });
  handlers.on(Op::pull, [this](const Request& r) { pull(r); });
  handlers.on(Op::push, [this](const Request& r) { push(r); });
  handlers.on(Op::push_pull, [this](const Request& r) { push(r); });
  handlers.on(Op::assign, [this](const Request& r) { assign(r); });
  handlers.on(Op::snapshot, [this](const Request& r) { snapshot(r); });
}

void ChunkHandlers::init(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request, false);
  store_.init(id.variable, id.chunk, values.get());
  reply_version(sink_, request, *store_.find(id.variable, id.chunk));
}

// Also the pull half of a resent push_pull (op push_pull, no payload;
// Dispatcher::answer_resend).
void ChunkHandlers::pull(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  if (!wire::is_float(request.header.dtype))
    throw wire::ProtocolError("pull asks for values as " +
                              std::string(wire::to_string(request.header.dtype)) +
                              "; they travel as f32, bf16 or fp16");
  policy_->on_pull(request, id, existing_chunk(store_, id));
}

void ChunkHandlers::push(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload grad(request, true);
  refuse_nonfinite(request, grad.get());
  policy_->on_push(request, id, grad.get());
}

void ChunkHandlers::assign(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request, false);
  refuse_nonfinite(request, values.get());
  const Chunk& c = store_.assign(id.variable, id.chunk, values.get());
  coordinator_.applied_update(request.header);
  reply_version(sink_, request, c);
}

void ChunkHandlers::refuse_nonfinite(const Request& request, std::span<const float> values) {
  // One pass the compiler vectorizes; cheaper than the optimizer after it.
  bool finite = true;
  for (const float v : values) finite &= std::isfinite(v);
  if (finite) return;
  stats_.nonfinite_refused();
  const auto sender = request.header.sender;
  if (poisoners_.size() < kMaxLoggedPoisoners && poisoners_.insert(sender).second)
    log("refused a ", wire::to_string(request.header.op),
        " with NaN or infinite values from sender ", sender,
        "; later ones from it are only counted (stats: nonfinite_refused)");
  throw std::invalid_argument("NaN or infinite values; nothing was stored");
}

ChunkHandlers::~ChunkHandlers() { finish(); }

void ChunkHandlers::snapshot(const Request& request) {
  finish();
  auto write = std::make_unique<SnapshotWrite>();
  write->request = request;
  write->request.payload = {};  // a snapshot request has none; keep no frame alive
  write->path = shard_file(run_dir_ / "snapshot", ps_index_);
  write->chunks = store_.size();
  write->writer = std::thread([w = write.get(), cut = cut_shard(store_, coordinator_, config_hash_,
                                                                SnapshotKind::snapshot)]() mutable {
    try {
      write_shard(w->path, cut);
    } catch (const std::exception& e) {
      w->error = e.what();
    }
    cut.chunks.clear();  // let go of the buffers before saying so
    w->done.store(true, std::memory_order_release);
  });
  snapshot_ = std::move(write);
}

void ChunkHandlers::tick() {
  if (snapshot_ && snapshot_->done.load(std::memory_order_acquire)) answer_snapshot();
  policy_->on_tick();
}

void ChunkHandlers::finish() {
  if (snapshot_) answer_snapshot();
}

void ChunkHandlers::answer_snapshot() {
  auto write = std::move(snapshot_);
  write->writer.join();
  const auto& request = write->request;
  if (!write->error.empty()) {
    log("snapshot failed: ", write->error);
    sink_.send(request.from, {wire::error_reply(request.header, "snapshot: " + write->error), {}});
    return;
  }
  log("snapshot of ", write->chunks, " chunks written to ", write->path.string());
  Reply reply{wire::reply_to(request.header), {}};
  wire::SnapshotReply{write->path.string()}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

}  // namespace pstrain::ps
