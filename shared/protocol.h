#pragma once
// The wire protocol between workers and parameter servers.
//
// A message is a multipart ZeroMQ message: one header frame, serialized with
// Cereal's portable binary archive, followed by `payload_frames` raw frames
// that hold float32 data exactly as it sits in memory (little-endian hosts
// only). Payloads never pass through Cereal: the sender hands its buffer to
// ZeroMQ and the receiver reads the frame in place.
//
// Decoding trusts nothing. Every length the header declares is checked
// against the frame it came in and against the limits below before anything
// is allocated, so a crafted header cannot make a process allocate more than
// the frame holds; a failure throws ProtocolError with a message naming the
// field.
//
// Every request gets exactly one reply with the same request id and the same
// op; a failed request gets status=error and `error` naming the problem.
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pstrain::wire {

inline constexpr std::uint32_t kProtocolVersion = 1;
inline constexpr std::size_t kMaxHeaderBytes = 64 * 1024;
inline constexpr std::size_t kMaxNameBytes = 1024;     // variable names, keys
inline constexpr std::size_t kMaxTextBytes = 60 * 1024;  // error text, kv values
inline constexpr std::size_t kMaxPayloadBytes = 16 * 1024 * 1024;
inline constexpr std::size_t kMaxPayloadFrames = 2;

enum class Op : std::uint8_t {
  hello = 1,     // protocol version, run id and config hash; refused on mismatch
  init,          // create a chunk if absent (payload: initial values)
  pull,          // reply payload: the chunk's values; reply version
  push,          // payload: gradient, applied with the ps's optimizer
  push_pull,     // push, then reply with the updated values
  assign,        // payload: values that overwrite the chunk (sync mode, restore)
  barrier,       // reply once `count` distinct senders have entered barrier `text`
  snapshot,      // write every chunk to run_dir atomically; reply text: path
  stats,         // reply text: JSON counters of the ps
  shutdown,      // stop serving after replying
  kv_set,        // rendezvous store: key `variable`, value = payload bytes
  kv_get,        // reply when key `variable` exists (or time out), payload: value
  heartbeat,     // liveness; `count` carries samples trained since the last one
  done,          // a worker finished; `count` carries its total samples
};
inline constexpr std::uint8_t kMaxOp = static_cast<std::uint8_t>(Op::done);

enum class DType : std::uint8_t { f32 = 0, bytes = 1 };
enum class Status : std::uint8_t { ok = 0, error = 1 };

std::string_view to_string(Op op);
std::size_t element_bytes(DType type);

struct Header {
  std::uint32_t protocol = kProtocolVersion;
  Op op = Op::hello;
  std::uint64_t request_id = 0;
  std::uint32_t sender = 0;     // worker index (or a client id for tools)
  std::uint64_t run_id = 0;     // config hash of the run; 0 only in hello replies
  std::string variable;         // variable name, barrier name or kv key
  std::uint32_t chunk = 0;
  std::uint64_t version = 0;    // updates applied to the chunk so far
  DType dtype = DType::f32;
  std::uint64_t count = 0;      // elements in the payload, or an op's count
  std::uint32_t payload_frames = 0;
  Status status = Status::ok;
  std::string text;             // error text, or an op's text argument/result

  template <class Archive>
  void serialize(Archive& ar);  // defined in protocol.cc (bounded strings)
};

struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::uint8_t> encode_header(const Header& header);

// Decodes and validates a header frame: size limits, known op, dtype and
// status, string lengths, payload_frames <= kMaxPayloadFrames, and
// count * element size <= kMaxPayloadBytes. Throws ProtocolError.
Header decode_header(std::span<const std::uint8_t> frame);

// Checks that payload frame `index` of `header` has the declared size
// (count elements of dtype). Throws ProtocolError naming both sizes.
void check_payload(const Header& header, std::size_t index, std::size_t frame_bytes);

// A reply header for `request`: same op, request id, variable and chunk.
Header reply_to(const Header& request);
Header error_reply(const Header& request, std::string text);

}  // namespace pstrain::wire
