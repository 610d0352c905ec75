#include "server/data_handlers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

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

// A chunk's values as a reply to `request` carries them: its dtype's. f32
// goes out as the chunk's own buffer; bf16 and fp16 as a rounded copy.
ReplyPayload values_for(const Request& request, const ValueBuffer& values) {
  const auto half = wire::half_format(request.header.dtype);
  if (!half) return values;
  auto bits = std::make_shared<std::vector<std::uint16_t>>(values->size());
  encode_halves(*half, values->data(), bits->data(), values->size());
  return HalfValues{request.header.dtype, std::move(bits)};
}

}  // namespace

DataHandlers::DataHandlers(ChunkStore& store, Coordinator& coordinator, ReplySink& sink,
                           PsStats& stats, std::filesystem::path run_dir, std::uint32_t ps_index,
                           std::uint64_t config_hash, Consistency consistency)
    : store_(store),
      coordinator_(coordinator),
      sink_(sink),
      stats_(stats),
      run_dir_(std::move(run_dir)),
      ps_index_(ps_index),
      config_hash_(config_hash) {
  if (consistency.mode == Mode::ssp) ssp_.emplace(consistency.workers, consistency.staleness_bound);
  if (consistency.mode == Mode::backup) backup_.emplace(consistency.backup_workers);
  lr_scaling_ = consistency.lr_scaling;
  accumulate_steps_ = consistency.accumulate_steps;
}

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
  Reply reply{wire::reply_to(request.header), values_for(request, chunk.values)};
  wire::ChunkReply{chunk.version}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void DataHandlers::init(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request, false);
  store_.init(id.variable, id.chunk, values.get());
  reply_version(request, *store_.find(id.variable, id.chunk));
}

void DataHandlers::reply_update(const Request& request, const Chunk& chunk) {
  if (request.header.op == Op::push_pull) return reply_values(request, chunk);
  reply_version(request, chunk);
}

const Chunk& DataHandlers::chunk_of(const wire::ChunkRequest& id) const {
  const Chunk* c = store_.find(id.variable, id.chunk);
  if (!c) throw std::invalid_argument("unknown chunk (not initialized on this ps)");
  return *c;
}

// Also the pull half of a resent push_pull (op push_pull, no payload;
// Dispatcher::answer_resend).
void DataHandlers::pull(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  if (!wire::is_float(request.header.dtype))
    throw wire::ProtocolError("pull asks for values as " +
                              std::string(wire::to_string(request.header.dtype)) +
                              "; they travel as f32, bf16 or fp16");
  const Chunk& c = chunk_of(id);
  if ((ssp_ && ssp_->retarget(request)) || (backup_ && backup_->retarget(request))) return;
  if (ssp_) {
    // A push_pull's reply is the read of the pusher's next step.
    const auto clock = request.header.op == Op::push_pull ? id.clock + 1 : id.clock;
    if (!ssp_->may_read(clock, slowest())) {
      ssp_->park(request, clock, store_.size());
      return count_held();
    }
  }
  reply_values(request, c);
}

void DataHandlers::push(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload grad(request, true);
  refuse_nonfinite(request, grad.get());
  if (backup_) return push_backup(request, id, grad.get());
  const Chunk& c = store_.push(id.variable, id.chunk, grad.get());
  // The request's version is the one its sender last pulled (ChunkRequest).
  const auto before = c.version - 1;
  stats_.pushed(before - std::min(before, request.header.version),
                store_.stats().last_optimizer_seconds);
  coordinator_.applied_update(request.header);
  if (ssp_) {
    ssp_->completed(request.header.sender, id.clock + 1);
    // One look at the clocks serves all three: the pusher's own completion
    // can raise the slowest only where its staleness is 0 either way.
    const auto slow = slowest();
    const auto staleness = SspGate::staleness(id.clock, slow);
    stats_.ssp_staleness(staleness);
    largest_staleness_ = std::max(largest_staleness_, staleness);
    release_reads(slow);
    if (request.header.op == Op::push_pull && !ssp_->may_read(id.clock + 1, slow)) {
      sink_.accepted(request.header, c.version);
      ssp_->park(request, id.clock + 1, store_.size());
      return count_held();
    }
  }
  reply_update(request, c);
}

std::uint64_t DataHandlers::slowest() const {
  return ssp_->slowest([this](std::uint32_t w) { return !coordinator_.absent(w); });
}

void DataHandlers::release_reads(std::uint64_t slowest) {
  const auto released = ssp_->release(slowest);
  for (const auto& read : released)
    reply_values(read, chunk_of(wire::ChunkRequest::read(read.header)));
  if (!released.empty()) count_held();
}

void DataHandlers::push_backup(const Request& request, const wire::ChunkRequest& id,
                               std::span<const float> grad) {
  const Chunk& c = chunk_of(id);
  const auto needed = backup_->needed(coordinator_.workers_training());
  const auto verdict = backup_->add(request, id.variable, id.chunk, c.version, grad, needed);
  // Acknowledged, whether applied with its step or dropped: what the
  // sender counts (PsClient::acked_updates, compared after a restore).
  coordinator_.applied_update(request.header);
  if (verdict == BackupAggregator::Verdict::late) {
    stats_.gradient_dropped();
    ++gradients_dropped_;
    return reply_update(request, c);
  }
  sink_.accepted(request.header, c.version);
  if (auto step = backup_->take_if_complete(id.variable, id.chunk, needed)) apply_step(*step);
  count_held();
}

void DataHandlers::apply_step(const BackupAggregator::Step& step) {
  const float lr_scale =
      lr_scaling_ ? static_cast<float>(step.waiting.size() * accumulate_steps_) : 1.0f;
  const Chunk& c = store_.push(step.name, step.chunk, step.mean, lr_scale);
  ++steps_applied_;
  for (const auto& r : step.waiting) reply_update(r, c);
}

void DataHandlers::count_held() {
  stats_.held(ssp_ ? ssp_->parked() : 0, backup_ ? backup_->held() : 0);
}

void DataHandlers::assign(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request, false);
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
    log("refused a ", wire::to_string(request.header.op),
        " with NaN or infinite values from sender ", sender,
        "; later ones from it are only counted (stats: nonfinite_refused)");
  throw std::invalid_argument("NaN or infinite values; nothing was stored");
}

void DataHandlers::log_summary() const {
  if (ssp_)
    log("mode ssp: the largest staleness of an applied update was ", largest_staleness_,
        " steps (train.staleness_bound ", ssp_->bound(), ")");
  if (backup_)
    log("mode backup: ", steps_applied_, " chunk steps applied, ", gradients_dropped_,
        " late gradients dropped");
}

DataHandlers::~DataHandlers() { finish(); }

void DataHandlers::snapshot(const Request& request) {
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

void DataHandlers::tick() {
  if (snapshot_ && snapshot_->done.load(std::memory_order_acquire)) answer_snapshot();
  if (ssp_) release_reads(slowest());
  if (backup_) {
    const auto steps = backup_->take_complete(backup_->needed(coordinator_.workers_training()));
    for (const auto& step : steps) apply_step(step);
    if (!steps.empty()) count_held();
  }
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
