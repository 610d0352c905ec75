#pragma once
// The wire protocol between workers and parameter servers.
//
// A message is a multipart ZeroMQ message of one or more requests (or
// replies) back to back, each a header frame followed by its
// `payload_frames` raw frames: a client's small requests of one call to one
// ps share a message, and the ps answers them likewise, so a variable cut
// into many small chunks costs fewer wake-ups of each side's threads
// (client/ps/ps_channel.h, PsChannel::Batch). The header frame is written by Cereal through
// two small archives of our own (protocol.cc): fixed-width integers as they
// sit in memory and strings as a u32 length and their bytes, with no stream
// and no portable-binary endianness handling (little-endian hosts only, which
// protocol.cc asserts). Payload frames hold float32 data or raw bytes exactly
// as they sit in memory and never pass through Cereal: the sender hands its
// buffer to ZeroMQ and the receiver reads the frame in place.
//
// Decoding trusts nothing. Every length the header declares is checked
// against the frame it came in and against the limits below before anything
// is allocated, so a crafted header cannot make a process allocate more than
// the frame holds; a failure throws ProtocolError with a message naming the
// field.
//
// Every request gets exactly one reply with the same request id and the same
// op; a failed request gets status=error and its `text` naming the problem.
//
// The Header is the frame's fixed set of slots; which slot holds what depends
// on the op. Code does not read the slots directly: shared/messages.h gives
// every op's request and reply a typed view.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "shared/error.h"
#include "shared/low_precision.h"

namespace pstrain::wire {

// 2: kv_get's timeout is a number (`arg`, milliseconds), op arguments moved
// from `count` to `arg`, and `count` became `elements` (payload only).
// 3: `incarnation` and `generation`; request ids are sequence numbers a
// resend repeats.
// 4: pull, push and push_pull carry the sender's clock (`arg`), push and
// push_pull the chunk version their gradient was computed on (`version`).
// 5: dtypes bf16 and fp16: pull, push and push_pull may carry values and
// gradients in 16 bits, and a pull's dtype names its reply's; `priority`.
// 6: heartbeat is liveness alone; samples and "finished pushing" travel in
// the new op progress; `arg` is named `operand`; the sparse ops, whose
// frames hold ids and rows (payload_frame_bytes).
// 7: a message may carry several requests or replies back to back.
// 8: the op step, a primary's word to its backup in mode backup.
inline constexpr std::uint32_t kProtocolVersion = 8;
inline constexpr std::size_t kMaxHeaderBytes = 64 * 1024;
inline constexpr std::size_t kMaxNameBytes = 1024;       // `name`: variables, barriers, keys
inline constexpr std::size_t kMaxTextBytes = 60 * 1024;  // `text`: error text, config, JSON
inline constexpr std::size_t kMaxPayloadBytes =
    16 * 1024 * 1024;  // per payload frame (kv values too)
inline constexpr std::size_t kMaxPayloadFrames = 2;
// Requests (or replies) one message holds at most; a ps refuses a message of
// more, whole.
inline constexpr std::size_t kMaxRequestsPerMessage = 256;
// The largest frame of any legal message: sockets set ZMQ_MAXMSGSIZE to it,
// so a peer announcing a larger one is disconnected before anything is
// allocated for it.
inline constexpr std::size_t kMaxFrameBytes = std::max(kMaxHeaderBytes, kMaxPayloadBytes);

// Fail-over (replication.replicas 2, server/replicator.h): a worker sends the
// requests of ps `primary`'s shard to that ps's backup from a socket whose
// routing identity begins with failover_peer(primary) (this prefix, the
// index and a slash; a random part follows), which is how the backup tells
// them from requests for its own shard.
inline constexpr std::string_view kFailoverPeerPrefix = "pstrain-failover-of-ps-";
inline std::string failover_peer(std::uint32_t primary) {
  return std::string(kFailoverPeerPrefix) + std::to_string(primary) + "/";
}
// The beginning of the error a backup answers a fail-over request with once
// it handed the shard back to its primary's new process (a restart that
// re-joined): the worker sends the shard's requests to the primary again.
inline constexpr std::string_view kMovedBack = "moved back: ";

// Each op's request and reply are described by its view in shared/messages.h.
enum class Op : std::uint8_t {
  hello = 1,         // protocol version, run id and config hash; refused on mismatch
  init,              // create a chunk if absent (payload: initial values)
  pull,              // reply payload: the chunk's values; reply version
  push,              // payload: gradient, applied with the ps's optimizer
  push_pull,         // push, then reply with the updated values
  assign,            // payload: values that overwrite the chunk (sync mode, restore)
  barrier,           // reply once `count` distinct senders have entered the barrier
  snapshot,          // write every chunk to run_dir atomically; reply: the path
  stats,             // reply: JSON counters of the ps
  shutdown,          // stop serving after replying
  kv_set,            // rendezvous store: set a key; the value is the payload frame
  kv_get,            // reply when the key exists (or time out), payload: value
  heartbeat,         // liveness
  done,              // a worker finished, with its total samples
  progress,          // samples trained since the last report; the last push made
  sparse_pull,       // ids -> their rows of an embedding table (created on first touch)
  sparse_push,       // ids and row gradients, applied by the table's row optimizer
  sparse_push_pull,  // sparse_push, then reply with the updated rows
  // Between ps only (replication.replicas 2, mode backup): the primary
  // applied a step of a chunk; payload: the gradients' mean it applied.
  step,
};
inline constexpr std::uint8_t kMaxOp = static_cast<std::uint8_t>(Op::step);
// The ops on an embedding table's rows (shared/messages.h, SparseRequest).
inline bool is_sparse(Op op) {
  return op == Op::sparse_pull || op == Op::sparse_push || op == Op::sparse_push_pull;
}
// The ops on parameters (chunks or rows): a client resends them, fault
// injection may drop them.
inline bool is_data_op(Op op) {
  return op == Op::init || op == Op::pull || op == Op::push || op == Op::push_pull ||
         op == Op::assign || is_sparse(op);
}
// The ops that change parameters: the ps records them (server/dedup.h), a
// client counts their acknowledgements.
inline bool is_update(Op op) {
  return op == Op::push || op == Op::push_pull || op == Op::assign || op == Op::sparse_push ||
         op == Op::sparse_push_pull;
}
// The widest row a table may have: a row's values travel in one frame
// with the rest of a request's.
inline constexpr std::uint32_t kMaxRowWidth = 1 << 16;

// bf16 and fp16 are the 16-bit bit patterns of shared/low_precision.h, which
// only chunk values and gradients travel in (net.wire_dtype). topk and sign
// are a push's compressed gradient (shared/gradient_compression.h,
// net.compression), counted in bytes: `elements` is the frame's size, the
// chunk's own size says how many floats it decodes to.
enum class DType : std::uint8_t { f32 = 0, bytes = 1, bf16 = 2, fp16 = 3, topk = 4, sign = 5 };
enum class Status : std::uint8_t { ok = 0, error = 1 };

std::string_view to_string(Op op);
std::size_t element_bytes(DType type);
std::string_view to_string(DType type);
// Whether chunk values and gradients may travel as `type`: f32, bf16, fp16.
inline bool is_float(DType type) {
  return type == DType::f32 || type == DType::bf16 || type == DType::fp16;
}
// Whether a push's gradient may travel as `type`: a float type, or compressed.
inline bool is_compressed(DType type) { return type == DType::topk || type == DType::sign; }
// The 16-bit format a dtype's frames hold; nullopt for f32 and bytes.
std::optional<HalfFormat> half_format(DType type);
DType dtype_of(HalfFormat format);
// Widens the frame's bf16 or fp16 values, frame.size() / 2 of them, into
// `out`. A received frame may sit at any address (ZeroMQ keeps tiny ones
// inside its message struct), so this reads it through a copy when it is
// not 2-byte aligned.
void widen(HalfFormat format, std::span<const std::uint8_t> frame, float* out);

struct Header {
  std::uint32_t protocol = kProtocolVersion;
  Op op = Op::hello;
  // The sender's sequence number for this request, unique within its
  // incarnation; a resend carries the same id, which is how the ps tells a
  // resend from a new request (server/dedup.h).
  std::uint64_t request_id = 0;
  std::uint32_t sender = 0;  // worker index (or a client id for tools)
  // Random per client process start; 0: a sender that never resends, whose
  // requests the ps does not record.
  std::uint64_t incarnation = 0;
  std::uint64_t run_id = 0;  // ClusterConfig::run_id; 0 only in hello replies and errors
  // In every reply, errors included: the answering ps's generation, nonzero
  // and new whenever its state may have been lost (a process start); 0 in
  // requests. A client that sees it change knows the ps restarted.
  std::uint64_t generation = 0;
  std::string name;  // what the op names: a variable, a barrier or a key
  std::uint32_t chunk = 0;
  std::uint64_t version = 0;  // updates applied to the chunk so far
  // The op's one number: a count, samples, milliseconds, a clock
  // (shared/messages.h names it per op).
  std::uint64_t operand = 0;
  DType dtype = DType::f32;    // of the payload frames
  std::uint64_t elements = 0;  // per payload frame; 0 without payload
  std::uint32_t payload_frames = 0;
  Status status = Status::ok;
  std::string text;  // error text, or the op's text (config, path, JSON)
  // The order a ps serves the requests it finds queued together: lower
  // first, equal ones in arrival order (server/request_loop.h).
  std::uint32_t priority = 0;

  template <class Archive>
  void serialize(Archive& ar);  // defined in protocol.cc (bounded strings)
};

struct ProtocolError : pstrain::Error {
  using pstrain::Error::Error;
};

std::vector<std::uint8_t> encode_header(const Header& header);

// Decodes and validates a header frame: size limits, known op, dtype and
// status, string lengths, payload_frames <= kMaxPayloadFrames, no elements
// without payload frames, and every frame it declares within
// kMaxPayloadBytes (sparse ops with frames: a row width of 1 to
// kMaxRowWidth).
// Throws ProtocolError.
Header decode_header(std::span<const std::uint8_t> frame);

// The bytes payload frame `index` of a message with `header` holds:
// elements of dtype; in the sparse ops, whose `elements` counts ids and
// `chunk` is the row width, a request's frame 0 is the ids (uint64) and its
// frame 1 the rows (elements x chunk of dtype), and a reply's frame 0 the
// rows. `reply`: the message is a reply.
std::size_t payload_frame_bytes(const Header& header, std::size_t index, bool reply);
// Checks that payload frame `index` has the size payload_frame_bytes says.
// Throws ProtocolError naming both sizes.
void check_payload(const Header& header, std::size_t index, std::size_t frame_bytes,
                   bool reply = false);

// A reply header for `request`: same op, request id, name and chunk.
Header reply_to(const Header& request);
Header error_reply(const Header& request, std::string text);

}  // namespace pstrain::wire
