#include "server/data_handlers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "shared/log.h"
#include "shared/messages.h"
#include "server/shard_file.h"

namespace pstrain::ps {
namespace {

using wire::Op;

// Senders logged by name at their first refused update; a peer cycling
// through made-up sender ids cannot grow the set beyond this.
constexpr std::size_t kMaxLoggedPoisoners = 1024;

// The float payload of a request, read in place when the frame is suitably
// aligned (ZeroMQ's buffers are, for every frame but the tiny inline ones).
class FloatPayload {
 public:
  explicit FloatPayload(const Request& request) {
    const auto bytes = request.payload_of(wire::DType::f32);
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

DataHandlers::DataHandlers(ChunkStore& store, Coordinator& coordinator, ReplySink& sink,
                           PsStats& stats,
                           std::filesystem::path run_dir, std::uint32_t ps_index,
                           std::uint64_t config_hash)
    : store_(store),
      coordinator_(coordinator),
      sink_(sink),
      stats_(stats),
      run_dir_(std::move(run_dir)),
      ps_index_(ps_index),
      config_hash_(config_hash) {}

void DataHandlers::add_handlers(Handlers& handlers) {
  handlers.on(Op::init, [this](const Request& r) { init(r); });
  handlers.on(Op::pull, [this](const Request& r) { pull(r); });
  handlers.on(Op::push, [this](const Request& r) { push(r); });
  handlers.on(Op::push_pull, [this](const Request& r) { push(r); });
  handlers.on(Op::assign, [this](const Request& r) { assign(r); });
  handlers.on(Op::snapshot, [this](const Request& r) { snapshot(r); });
}

void DataHandlers::reply_version(const Request& request, const Chunk& chunk) {
  Reply reply{wire::reply_to(request.header), {}};
  wire::ChunkReply{chunk.version}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void DataHandlers::reply_values(const Request& request, const Chunk& chunk) {
  Reply reply{wire::reply_to(request.header), chunk.values};
  wire::ChunkReply{chunk.version}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void DataHandlers::init(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request);
  store_.init(id.variable, id.chunk, values.get());
  reply_version(request, *store_.find(id.variable, id.chunk));
}

void DataHandlers::pull(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const Chunk* c = store_.find(id.variable, id.chunk);
  if (!c) throw std::invalid_argument("unknown chunk (not initialized on this ps)");
  reply_values(request, *c);
}

void DataHandlers::push(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload grad(request);
  refuse_nonfinite(request, grad.get());
  const Chunk& c = store_.push(id.variable, id.chunk, grad.get());
  // The request's version is the one its sender last pulled (ChunkRequest).
  const auto before = c.version - 1;
  stats_.pushed(before - std::min(before, request.header.version),
                store_.stats().last_optimizer_seconds);
  coordinator_.applied_update(request.header);
  if (request.header.op == Op::push_pull) return reply_values(request, c);
  reply_version(request, c);
}

void DataHandlers::assign(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request);
  refuse_nonfinite(request, values.get());
  const Chunk& c = store_.assign(id.variable, id.chunk, values.get());
  coordinator_.applied_update(request.header);
  reply_version(request, c);
}

void DataHandlers::refuse_nonfinite(const Request& request, std::span<const float> values) {
  // One pass the compiler vectorizes; cheaper than the optimizer after it.
  bool finite = true;
  for (const float v : values) finite &= std::isfinite(v);
  if (finite) return;
  stats_.nonfinite_refused();
  const auto sender = request.header.sender;
  if (poisoners_.size() < kMaxLoggedPoisoners && poisoners_.insert(sender).second)
    log("refused a ", wire::to_string(request.header.op), " with NaN or infinite values from sender ",
        sender, "; later ones from it are only counted (stats: nonfinite_refused)");
  throw std::invalid_argument("NaN or infinite values; nothing was stored");
}

DataHandlers::~DataHandlers() { finish(); }

void DataHandlers::snapshot(const Request& request) {
  finish();
  auto write = std::make_unique<SnapshotWrite>();
  write->request = request;
  write->request.payload = {};  // a snapshot request has none; keep no frame alive
  write->path = shard_file(run_dir_ / "snapshot", ps_index_);
  write->chunks = store_.size();
  write->writer = std::thread(
      [w = write.get(), cut = cut_shard(store_, coordinator_, config_hash_,
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

void DataHandlers::tick() {
  if (snapshot_ && snapshot_->done.load(std::memory_order_acquire)) answer_snapshot();
}

void DataHandlers::finish() {
  if (snapshot_) answer_snapshot();
}

void DataHandlers::answer_snapshot() {
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
