#pragma once
// What the ps reads out of an update before anything is stored: its values
// or gradients as f32 (FloatPayload), and the refusal of a NaN or an
// infinity (NonfiniteRefusal: one poisoned gradient would spoil a chunk or
// a row for the rest of the run). The chunk ops and the sparse ops share
// them.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "server/ps_stats.h"
#include "server/request.h"

namespace pstrain::ps {

// An update's float frame `bytes` (of request.header.dtype): read in place
// when f32 and suitably aligned (ZeroMQ's buffers are, for every frame but
// the tiny inline ones), else copied; bf16 or fp16 (net.wire_dtype) widened
// to f32, and a compressed gradient (topk, sign: net.compression) decoded
// into `dense` floats, so the optimizer and the stored values only see f32.
// Throws wire::ProtocolError naming the op when the dtype is not a float
// one, a half one where `halves_allowed` is false (values stored exactly),
// a compressed one where `dense` is 0 (not a chunk's gradient), or a
// compressed frame that does not decode.
class FloatPayload {
 public:
  FloatPayload(const Request& request, std::span<const std::uint8_t> bytes, bool halves_allowed,
               std::size_t dense = 0);
  std::span<const float> get() const { return view_; }

 private:
  std::vector<float> copy_;
  std::span<const float> view_;
};

class NonfiniteRefusal {
 public:
  explicit NonfiniteRefusal(PsStats& stats) : stats_(stats) {}
  // Throws std::invalid_argument (after counting it, and logging the first
  // from each sender) unless every value is finite.
  void check(const Request& request, std::span<const float> values);

 private:
  // Senders logged by name at their first refused update; a peer cycling
  // through made-up sender ids cannot grow the set beyond this.
  static constexpr std::size_t kMaxLogged = 1024;
  PsStats& stats_;
  std::set<std::uint32_t> logged_;
};

}  // namespace pstrain::ps
