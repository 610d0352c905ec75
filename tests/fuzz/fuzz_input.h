#pragma once
// How a fuzzer's input bytes become ZeroMQ frames, for the fuzz targets
// (which split) and the seed writer (which joins). Every byte string is a
// valid input: lengths are clamped to what remains, so the fuzzer's
// mutations never make an input unreadable, only short.
//
// A frame is a u32 little-endian length and that many bytes (fewer when the
// input ends first):
//   header target:  input   := frame*            the header frame, then payload frames
//   ps target:      input   := message*
//                   message := control:u8 frame{control & 3}
// The ps target prefixes each message with the sender's identity (fixed)
// and moves its clock on by (control >> 2) milliseconds before handling it,
// so kv_get deadlines and worker timeouts are reachable as well.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace pstrain::fuzz {

using Bytes = std::span<const std::uint8_t>;

// The ps target's cluster: the run id its requests must carry to get past
// the checks, and its workers (senders 0 and 1).
inline constexpr std::uint64_t kPsRunId = 0x5eed5eed5eed5eedULL;
inline constexpr std::uint32_t kPsWorkers = 2;

// Reads one frame off the front of `in` (which it shortens); false when `in`
// is empty.
inline bool take_frame(Bytes& in, Bytes& frame) {
  if (in.empty()) return false;
  std::uint32_t len = 0;
  const std::size_t prefix = std::min(in.size(), sizeof len);
  std::memcpy(&len, in.data(), prefix);  // little-endian hosts (shared/protocol.h)
  in = in.subspan(prefix);
  frame = in.first(std::min<std::size_t>(len, in.size()));
  in = in.subspan(frame.size());
  return true;
}

inline void append_frame(std::vector<std::uint8_t>& out, Bytes frame) {
  const auto len = static_cast<std::uint32_t>(frame.size());
  const auto* p = reinterpret_cast<const std::uint8_t*>(&len);
  out.insert(out.end(), p, p + sizeof len);
  out.insert(out.end(), frame.begin(), frame.end());
}

}  // namespace pstrain::fuzz
