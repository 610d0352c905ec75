#pragma once
// Typed views of the wire header (shared/protocol.h), one per request and
// reply: which Header slot carries what for each op is written down here and
// nowhere else. A sender fills a view and writes it into the header it sends;
// a receiver reads the view from the header it decoded.
//
//   wire::Header h;
//   h.op = wire::Op::kv_get;
//   wire::KvGet{"w0/gloo/0", 2000}.write(h);          // client
//   const auto get = wire::KvGet::read(request);       // ps: get.key, get.timeout_ms
//
// Payload frames (values, gradients, kv values) are not part of any view:
// they travel as their own frames, described by Header::dtype and elements.
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shared/protocol.h"

namespace pstrain::wire {

// init, pull, push, push_pull, assign: one chunk of a variable. init, push,
// push_pull and assign carry one payload frame (values or gradient): f32 for
// init and assign, whose values are stored exactly; f32, bf16 or fp16 for
// push and push_pull (net.wire_dtype), which the ps widens to f32 before its
// optimizer sees them. A pull's or push_pull's dtype is also the one its
// reply's values travel in: the ps rounds its f32 values for the reply.
// pull, push and push_pull also carry the sender's clock: the steps it
// completed before the one it pulls for or pushes from (mode ssp holds a
// pull of a worker too far ahead, server/consistency/ssp_gate.h); push and push_pull
// the chunk's version their gradient was computed on, the one the sender
// last pulled: the ps counts the updates applied since as the update's
// staleness (0 from a sender that never pulled, such as a tool), and mode
// backup drops a gradient of a step already applied
// (server/consistency/backup_aggregator.h). `priority`: the variable's place in the
// model, layer 0's first (P3's priority order): a ps serves what it finds
// queued together lowest first, so the weights the next forward pass needs
// first leave first and the gradients of the last layers, sent first in
// backward, do not wait behind the rest.
struct ChunkRequest {
  std::string variable;
  std::uint32_t chunk = 0;
  std::uint64_t clock = 0;
  std::uint64_t base_version = 0;
  std::uint32_t priority = 0;
  void write(Header& h) const {
    h.name = variable;
    h.chunk = chunk;
    h.operand = clock;
    h.version = base_version;
    h.priority = priority;
  }
  static ChunkRequest read(const Header& h) {
    return {h.name, h.chunk, h.operand, h.version, h.priority};
  }
};

// step (replication.replicas 2, mode backup; server/replicator.h): a primary
// tells its backup that it applied a step of chunk `chunk` of `variable`,
// whose version was `base_version` before it: the mean of `gradients`
// gradients, the payload (f32), so that the copy applies the same step with
// the same arithmetic whatever gradients it was forwarded. Replied to like a
// push.
struct StepRequest {
  std::string variable;
  std::uint32_t chunk = 0;
  std::uint64_t base_version = 0;
  std::uint64_t gradients = 0;
  void write(Header& h) const {
    h.name = variable;
    h.chunk = chunk;
    h.version = base_version;
    h.operand = gradients;
  }
  static StepRequest read(const Header& h) { return {h.name, h.chunk, h.version, h.operand}; }
};

// A shard's state between two ps (replication.replicas 2,
// server/shard_state.h) travels in pieces: piece `index` of a state of
// `total` bytes, the payload. A primary's copy to its backup is heartbeats
// of operand Replicator::kResync, one request id for all its pieces; a
// joining ps asks its backup for piece `index` of its shard's hand-back
// (total 0), and the answers carry the piece, the hand-back's id in
// `operand`.
struct ShardPiece {
  std::uint32_t index = 0;
  std::uint64_t total = 0;
  void write(Header& h) const {
    h.chunk = index;
    h.version = total;
  }
  static ShardPiece read(const Header& h) { return {h.chunk, h.version}; }
};

// Their replies: the chunk's version after the op; pull and push_pull also
// carry the chunk's values as one payload frame of the request's dtype.
struct ChunkReply {
  std::uint64_t version = 0;
  void write(Header& h) const { h.version = version; }
  static ChunkReply read(const Header& h) { return {h.version}; }
};

// sparse_pull, sparse_push, sparse_push_pull: rows of embedding table
// `table`, `dim` values each, for the ids in payload frame 0 (uint64, sorted,
// unique, every one homed on the ps that gets them: shared/embedding.h);
// sparse_push and sparse_push_pull carry the rows' gradients in frame 1
// (f32, bf16 or fp16 as net.wire_dtype), and the replies of sparse_pull and
// sparse_push_pull the rows in frame 0, in the request's dtype. `clock` and
// `priority` as in ChunkRequest.
struct SparseRequest {
  std::string table;
  std::uint32_t dim = 0;
  std::uint64_t clock = 0;
  std::uint32_t priority = 0;
  void write(Header& h) const {
    h.name = table;
    h.chunk = dim;
    h.operand = clock;
    h.priority = priority;
  }
  static SparseRequest read(const Header& h) { return {h.name, h.chunk, h.operand, h.priority}; }
};
// Their replies: how many rows the request created (a push of ids without
// a row; a pull creates none).
struct SparseReply {
  std::uint64_t created = 0;
  void write(Header& h) const { h.operand = created; }
  static SparseReply read(const Header& h) { return {h.operand}; }
};

// hello: the sender's resolved config, so a ps refusing its run id can tell
// another launch of the same config (same hash) from a different config and
// name the keys that differ; and the updates (chunk pushes and assigns) of
// this sender that this ps acknowledged, as the sender counted them, so a ps
// restored from a checkpoint can say how many of them the restore lost.
struct Hello {
  std::string config_yaml;
  std::uint64_t acked_updates = 0;
  void write(Header& h) const {
    h.text = config_yaml;
    h.operand = acked_updates;
  }
  static Hello read(const Header& h) { return {h.text, h.operand}; }
};
// The reply: the number of workers in the ps's cluster, and the updates its
// chunks hold (the sum of their versions, restored ones included): 0 for a ps
// that serves fresh values, which a worker of a run under way refuses.
struct HelloReply {
  std::uint64_t workers = 0;
  std::uint64_t state_updates = 0;
  void write(Header& h) const {
    h.operand = workers;
    h.version = state_updates;
  }
  static HelloReply read(const Header& h) { return {h.operand, h.version}; }
};

// barrier: released once `count` distinct senders have entered `name`.
struct Barrier {
  std::string name;
  std::uint64_t count = 0;
  void write(Header& h) const {
    h.name = name;
    h.operand = count;
  }
  static Barrier read(const Header& h) { return {h.name, h.operand}; }
};
struct BarrierReply {
  std::uint64_t released = 0;  // requests the barrier released at once
  void write(Header& h) const { h.operand = released; }
  static BarrierReply read(const Header& h) { return {h.operand}; }
};

// Keys of the key-value store are namespaced by their writer: worker N
// writes only under "w<N>/" (PsControlClient::kv_set adds it; under security.curve
// the ps refuses a kv_set outside the sender key's namespace, server/rights.h),
// and a reader names the writer whose key it wants (PsControlClient::kv_get).
inline std::string kv_key(std::uint32_t writer, std::string_view key) {
  return "w" + std::to_string(writer) + "/" + std::string(key);
}
// The writer a stored key's namespace names; nullopt when it names none.
inline std::optional<std::uint32_t> kv_writer(std::string_view key) {
  const auto slash = key.find('/');
  if (key.size() < 3 || key[0] != 'w' || slash == std::string_view::npos || slash == 1)
    return std::nullopt;
  std::uint32_t writer = 0;
  const auto [end, ec] = std::from_chars(key.data() + 1, key.data() + slash, writer);
  if (ec != std::errc() || end != key.data() + slash) return std::nullopt;
  return writer;
}

// kv_set: the value is the request's one bytes payload frame.
struct KvSet {
  std::string key;
  void write(Header& h) const { h.name = key; }
  static KvSet read(const Header& h) { return {h.name}; }
};

// kv_get: waits up to `timeout_ms` for the key; the reply's one bytes
// payload frame is the value.
struct KvGet {
  std::string key;
  std::uint64_t timeout_ms = 0;
  void write(Header& h) const {
    h.name = key;
    h.operand = timeout_ms;
  }
  static KvGet read(const Header& h) { return {h.name, h.operand}; }
};

// heartbeat: liveness alone, no view.
// progress: samples a worker trained since its last report; and, once its
// last step's gradients are pushed, that it pushes no more (a ps in mode
// backup then stops waiting for its gradients).
struct Progress {
  std::uint64_t samples = 0;
  bool finished_pushing = false;
  void write(Header& h) const {
    h.operand = samples;
    h.version = finished_pushing ? 1 : 0;
  }
  static Progress read(const Header& h) { return {h.operand, h.version != 0}; }
};

struct Done {
  std::uint64_t total_samples = 0;  // the worker's total
  void write(Header& h) const { h.operand = total_samples; }
  static Done read(const Header& h) { return {h.operand}; }
};

// The reply to heartbeat, progress and done: samples all workers trained, as this ps
// counted them, and the sender's own share of them (restored from a
// checkpoint included), from which a restarted worker resumes its shard.
struct GlobalSamples {
  std::uint64_t global_samples = 0;
  std::uint64_t sender_samples = 0;
  void write(Header& h) const {
    h.operand = global_samples;
    h.version = sender_samples;
  }
  static GlobalSamples read(const Header& h) { return {h.operand, h.version}; }
};

// snapshot's reply: the file the ps wrote.
struct SnapshotReply {
  std::string path;
  void write(Header& h) const { h.text = path; }
  static SnapshotReply read(const Header& h) { return {h.text}; }
};

// stats' reply: the ps's counters as one JSON object (server/ps_stats.h).
struct StatsReply {
  std::string json;
  void write(Header& h) const { h.text = json; }
  static StatsReply read(const Header& h) { return {h.text}; }
};

// Any reply with status=error (wire::error_reply makes them).
// `retry_after_ms` nonzero: the refusal is temporary (a worker index held by
// a process that may have just died, server/coordinator.h), and asking again
// after that long may succeed; 0 for every other error.
struct ErrorReply {
  std::string text;
  std::uint64_t retry_after_ms = 0;
  void write(Header& h) const {
    h.text = text;
    h.operand = retry_after_ms;
  }
  static ErrorReply read(const Header& h) { return {h.text, h.operand}; }
};

}  // namespace pstrain::wire
