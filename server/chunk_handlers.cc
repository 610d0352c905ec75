#include "server/chunk_handlers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "server/chunk_replies.h"
#include "server/shard_file.h"
#include "server/update_payload.h"
#include "shared/log.h"
#include "shared/messages.h"

namespace pstrain::ps {
namespace {

using wire::Op;

}  // namespace

ChunkHandlers::ChunkHandlers(ChunkStore& store, Coordinator& coordinator, ReplySink& sink,
                             PsStats& stats, std::filesystem::path snapshot_file,
                             std::function<ShardCut()> snapshot_cut, const Consistency& consistency)
    : store_(store),
      coordinator_(coordinator),
      sink_(sink),
      nonfinite_(stats),
      snapshot_file_(std::move(snapshot_file)),
      snapshot_cut_(std::move(snapshot_cut)),
      policy_(make_policy(consistency, {store, coordinator, sink, stats})) {}

void ChunkHandlers::add_handlers(Handlers& handlers) {
  handlers.on(Op::init, [this](const Request& r) { init(r); });
  handlers.on(Op::pull, [this](const Request& r) { pull(r); });
  handlers.on(Op::push, [this](const Request& r) { push(r); });
  handlers.on(Op::push_pull, [this](const Request& r) { push(r); });
  handlers.on(Op::assign, [this](const Request& r) { assign(r); });
  handlers.on(Op::snapshot, [this](const Request& r) { snapshot(r); });
}

void ChunkHandlers::add_copy_handlers(Handlers& handlers) {
  add_handlers(handlers);
  handlers.on(Op::step, [this](const Request& r) { step(r); });
}

void ChunkHandlers::init(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request, request.payload_of(request.header.dtype), false);
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
  // A compressed gradient decodes into as many floats as its chunk holds.
  const std::size_t dense =
      wire::is_compressed(request.header.dtype) ? existing_chunk(store_, id).values->size() : 0;
  const FloatPayload grad(request, request.payload_of(request.header.dtype), true, dense);
  nonfinite_.check(request, grad.get());
  policy_->on_push(request, id, grad.get());
}

void ChunkHandlers::assign(const Request& request) {
  const auto id = wire::ChunkRequest::read(request.header);
  const FloatPayload values(request, request.payload_of(request.header.dtype), false);
  nonfinite_.check(request, values.get());
  const Chunk& c = store_.assign(id.variable, id.chunk, values.get());
  coordinator_.applied_update(request.header);
  reply_version(sink_, request, c);
}

void ChunkHandlers::step(const Request& request) {
  const FloatPayload mean(request, request.payload_of(wire::DType::f32), false);
  policy_->on_step(request, wire::StepRequest::read(request.header), mean.get());
}

ChunkHandlers::~ChunkHandlers() { finish(); }

void ChunkHandlers::snapshot(const Request& request) {
  finish();
  auto write = std::make_unique<SnapshotWrite>();
  write->request = request;
  write->request.payload = {};  // a snapshot request has none; keep no frame alive
  write->path = snapshot_file_;
  write->chunks = store_.size();
  write->writer = std::thread([w = write.get(), cut = snapshot_cut_()]() mutable {
    try {
      write_shard(w->path, cut);
    } catch (const std::exception& e) {
      w->error = e.what();
    }
    cut.chunks.clear();  // let go of the buffers and table segments before saying so
    cut.tables = TableCut();
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
