#pragma once
// What the ps's handlers see of a request and how they answer it, with no
// ZeroMQ in sight: the request loop (server/request_loop.h) turns a message
// into a Request, calls the Handler registered for its op, and sends the
// replies handlers give to their ReplySink. Unit tests drive handlers with a
// sink of their own.
//
// A handler answers a request once: at once, or later when the request was
// parked (a barrier, a kv_get). A handler that throws gets an error reply
// naming the ps, the op and the exception's text; the ps goes on serving.
//
// Thread rules: the ps is single-threaded. Handlers run one request at a time
// on the thread in RequestLoop::run, which is also the only thread that
// sends; nothing in the ps is locked.
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "server/chunk_store.h"
#include "shared/messages.h"
#include "shared/protocol.h"

namespace pstrain::ps {

using Clock = std::chrono::steady_clock;

// Who sent a request (its ROUTER identity, opaque bytes): where a reply goes.
using Peer = std::string;

struct Request {
  Peer from;
  wire::Header header;  // read through its view in shared/messages.h
  // The payload frame's bytes when the header declares one (its size already
  // checked against dtype and elements), else empty. Valid while the handler
  // runs; a handler that keeps the value copies it.
  std::span<const std::uint8_t> payload;
  // The second payload frame: a sparse push's row gradients (the ids are
  // `payload`); else empty.
  std::span<const std::uint8_t> rows;
  Clock::time_point received{};

  // The payload; throws wire::ProtocolError unless the request carries
  // exactly one payload frame of `type`.
  std::span<const std::uint8_t> payload_of(wire::DType type) const;
};

// Whether `resend` repeats `held`: the same sender, incarnation and request
// id (a client resends an unanswered request with its id, server/dedup.h).
bool repeats(const Request& resend, const Request& held);

// Bytes shared by whoever holds them: a kv value answers any number of
// kv_gets with one copy, held by the store and the replies in flight.
using SharedBytes = std::shared_ptr<const std::vector<std::uint8_t>>;

// A chunk's values rounded to bf16 or fp16 for one reply (net.wire_dtype).
struct HalfValues {
  wire::DType dtype = wire::DType::bf16;
  std::shared_ptr<const std::vector<std::uint16_t>> bits;
};

// A reply's payload frame: none, a chunk's values, bytes, or a chunk's values
// in 16 bits. All are sent without a copy: the frame holds a reference to the
// buffer until ZeroMQ has sent it (which is what ChunkStore's copy-on-write
// looks at).
using ReplyPayload = std::variant<std::monostate, ValueBuffer, SharedBytes, HalfValues>;

struct Reply {
  wire::Header header;  // from wire::reply_to / error_reply, plus its op's view
  ReplyPayload payload;
};

class ReplySink {
 public:
  virtual ~ReplySink() = default;
  // Sends `reply` to `to`. The sink fills the header's payload description
  // (payload_frames, dtype, elements) from `reply.payload`.
  virtual void send(const Peer& to, Reply reply) = 0;
  // A handler took the update of `request` (applied it, or kept it to apply
  // with others) but answers it later (modes ssp and backup hold replies):
  // the record of applied updates (server/dedup.h) must know it now, so a
  // resend meanwhile is not applied again. `version`: the chunk's version
  // now. Sinks that keep no record ignore it.
  virtual void accepted(const wire::Header& request, std::uint64_t version) {
    (void)request;
    (void)version;
  }
  // Mode backup applied a step of a chunk: `mean`, the mean of the gradients
  // of `contributors` (requests whose replies follow). With a backup, it
  // applies the same step (wire::Op::step) and the contributors' replies
  // wait until it has (server/replicator.h). Sinks without a backup ignore it.
  virtual void applied_step(const wire::StepRequest& step, std::span<const float> mean,
                            std::span<const Request> contributors) {
    (void)step;
    (void)mean;
    (void)contributors;
  }
};

using Handler = std::function<void(const Request&)>;

// The dispatch table: one handler per op.
class Handlers {
 public:
  // Throws std::logic_error when `op` has a handler already.
  void on(wire::Op op, Handler handler);
  // nullptr when no handler serves `op`.
  const Handler* find(wire::Op op) const;

 private:
  std::array<Handler, wire::kMaxOp + 1> table_;
};

}  // namespace pstrain::ps
