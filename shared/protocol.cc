#include "shared/protocol.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include <cereal/cereal.hpp>

// The archives below are Cereal archives over a byte vector (saving) and over
// the received frame itself (loading): no std::stream per message, and the
// loader knows how many bytes remain, which is what lets a string's declared
// length be checked before anything is allocated for it.
namespace pstrain::wire::detail {

static_assert(std::endian::native == std::endian::little,
              "payload frames carry host floats; only little-endian hosts are supported");

class VectorOutputArchive
    : public cereal::OutputArchive<VectorOutputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit VectorOutputArchive(std::vector<std::uint8_t>& out) : OutputArchive(this), out_(out) {}
  void saveBinary(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const std::uint8_t*>(data);
    out_.insert(out_.end(), bytes, bytes + size);
  }

 private:
  std::vector<std::uint8_t>& out_;
};

class FrameInputArchive
    : public cereal::InputArchive<FrameInputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit FrameInputArchive(std::span<const std::uint8_t> frame)
      : InputArchive(this), frame_(frame) {}
  void loadBinary(void* data, std::size_t size) {
    if (size > remaining())
      throw ProtocolError("header truncated: needed " + std::to_string(size) +
                          " more bytes at offset " + std::to_string(pos_) + " of " +
                          std::to_string(frame_.size()));
    std::memcpy(data, frame_.data() + pos_, size);
    pos_ += size;
  }
  std::size_t remaining() const { return frame_.size() - pos_; }

 private:
  std::span<const std::uint8_t> frame_;
  std::size_t pos_ = 0;
};

template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_SAVE_FUNCTION_NAME(VectorOutputArchive& ar,
                                                                    const T& t) {
  ar.saveBinary(&t, sizeof(t));
}
template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(FrameInputArchive& ar, T& t) {
  ar.loadBinary(&t, sizeof(t));
}
template <class T>
void CEREAL_SAVE_FUNCTION_NAME(VectorOutputArchive& ar, const cereal::BinaryData<T>& bd) {
  ar.saveBinary(bd.data, bd.size);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(FrameInputArchive& ar, cereal::BinaryData<T>& bd) {
  ar.loadBinary(bd.data, bd.size);
}

// Enums travel as their one-byte value; decode_header range-checks them.
template <class Archive, class E>
void enum_field(Archive& ar, E& e) {
  auto raw = static_cast<std::uint8_t>(e);
  ar(raw);
  if constexpr (Archive::is_loading::value) e = static_cast<E>(raw);
}

template <class Archive>
void string_field(Archive& ar, std::string& s, std::size_t max, const char* field) {
  if constexpr (Archive::is_saving::value) {
    if (s.size() > max)
      throw ProtocolError(std::string(field) + " is " + std::to_string(s.size()) +
                          " bytes, more than the limit of " + std::to_string(max));
    auto len = static_cast<std::uint32_t>(s.size());
    ar(len);
    ar(cereal::binary_data(s.data(), len));
  } else {
    std::uint32_t len = 0;
    ar(len);
    if (len > max)
      throw ProtocolError(std::string(field) + " declares " + std::to_string(len) +
                          " bytes, more than the limit of " + std::to_string(max));
    if (len > ar.remaining())
      throw ProtocolError(std::string(field) + " declares " + std::to_string(len) +
                          " bytes but only " + std::to_string(ar.remaining()) +
                          " remain in the header frame");
    s.resize(len);
    ar(cereal::binary_data(s.data(), len));
  }
}

}  // namespace pstrain::wire::detail

CEREAL_REGISTER_ARCHIVE(pstrain::wire::detail::VectorOutputArchive)
CEREAL_REGISTER_ARCHIVE(pstrain::wire::detail::FrameInputArchive)
CEREAL_SETUP_ARCHIVE_TRAITS(pstrain::wire::detail::FrameInputArchive,
                            pstrain::wire::detail::VectorOutputArchive)

namespace pstrain::wire {

template <class Archive>
void Header::serialize(Archive& ar) {
  ar(protocol);
  detail::enum_field(ar, op);
  ar(request_id, sender, incarnation, run_id, generation);
  detail::string_field(ar, name, kMaxNameBytes, "name");
  ar(chunk, version, operand);
  detail::enum_field(ar, dtype);
  ar(elements, payload_frames);
  detail::enum_field(ar, status);
  detail::string_field(ar, text, kMaxTextBytes, "text");
  ar(priority);
}

template void Header::serialize(detail::VectorOutputArchive&);
template void Header::serialize(detail::FrameInputArchive&);

std::string_view to_string(Op op) {
  switch (op) {
    case Op::hello:
      return "hello";
    case Op::init:
      return "init";
    case Op::pull:
      return "pull";
    case Op::push:
      return "push";
    case Op::push_pull:
      return "push_pull";
    case Op::assign:
      return "assign";
    case Op::barrier:
      return "barrier";
    case Op::snapshot:
      return "snapshot";
    case Op::stats:
      return "stats";
    case Op::shutdown:
      return "shutdown";
    case Op::kv_set:
      return "kv_set";
    case Op::kv_get:
      return "kv_get";
    case Op::heartbeat:
      return "heartbeat";
    case Op::done:
      return "done";
    case Op::progress:
      return "progress";
    case Op::sparse_pull:
      return "sparse_pull";
    case Op::sparse_push:
      return "sparse_push";
    case Op::sparse_push_pull:
      return "sparse_push_pull";
    case Op::step:
      return "step";
  }
  return "unknown";
}

std::size_t element_bytes(DType type) {
  switch (type) {
    case DType::f32:
      return sizeof(float);
    case DType::bytes:
    case DType::topk:
    case DType::sign:
      return 1;
    case DType::bf16:
    case DType::fp16:
      return 2;
  }
  throw ProtocolError("unknown dtype " + std::to_string(static_cast<int>(type)));
}

std::optional<HalfFormat> half_format(DType type) {
  if (type == DType::bf16) return HalfFormat::bf16;
  if (type == DType::fp16) return HalfFormat::fp16;
  return std::nullopt;
}

DType dtype_of(HalfFormat format) { return format == HalfFormat::bf16 ? DType::bf16 : DType::fp16; }

void widen(HalfFormat format, std::span<const std::uint8_t> frame, float* out) {
  const std::size_t n = frame.size() / sizeof(std::uint16_t);
  if (reinterpret_cast<std::uintptr_t>(frame.data()) % alignof(std::uint16_t) == 0) {
    decode_halves(format, reinterpret_cast<const std::uint16_t*>(frame.data()), out, n);
    return;
  }
  std::vector<std::uint16_t> aligned(n);
  if (n > 0) std::memcpy(aligned.data(), frame.data(), n * sizeof(std::uint16_t));
  decode_halves(format, aligned.data(), out, n);
}

std::string_view to_string(DType type) {
  switch (type) {
    case DType::f32:
      return "f32";
    case DType::bytes:
      return "bytes";
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::topk:
      return "topk";
    case DType::sign:
      return "sign";
  }
  return "unknown";
}

std::vector<std::uint8_t> encode_header(const Header& header) {
  std::vector<std::uint8_t> out;
  out.reserve(88 + header.name.size() + header.text.size());
  detail::VectorOutputArchive ar(out);
  // serialize() is non-const because loading shares it; saving only reads.
  ar(const_cast<Header&>(header));
  return out;
}

Header decode_header(std::span<const std::uint8_t> frame) {
  if (frame.size() > kMaxHeaderBytes)
    throw ProtocolError("header frame is " + std::to_string(frame.size()) +
                        " bytes, more than the limit of " + std::to_string(kMaxHeaderBytes));
  Header h;
  detail::FrameInputArchive ar(frame);
  ar(h);
  if (ar.remaining() != 0)
    throw ProtocolError("header frame has " + std::to_string(ar.remaining()) +
                        " unexpected trailing bytes");
  const auto op = static_cast<std::uint8_t>(h.op);
  if (op < static_cast<std::uint8_t>(Op::hello) || op > kMaxOp)
    throw ProtocolError("unknown op " + std::to_string(op));
  if (static_cast<std::uint8_t>(h.dtype) > static_cast<std::uint8_t>(DType::sign))
    throw ProtocolError("unknown dtype " + std::to_string(static_cast<int>(h.dtype)));
  if (static_cast<std::uint8_t>(h.status) > static_cast<std::uint8_t>(Status::error))
    throw ProtocolError("unknown status " + std::to_string(static_cast<int>(h.status)));
  if (h.payload_frames > kMaxPayloadFrames)
    throw ProtocolError("payload_frames is " + std::to_string(h.payload_frames) +
                        ", more than the limit of " + std::to_string(kMaxPayloadFrames));
  if (h.payload_frames == 0 && h.elements != 0)
    throw ProtocolError("elements is " + std::to_string(h.elements) +
                        " but the header declares no payload frames");
  if (h.elements > kMaxPayloadBytes / element_bytes(h.dtype))
    throw ProtocolError("payload of " + std::to_string(h.elements) + " elements of " +
                        std::to_string(element_bytes(h.dtype)) + " B exceeds the limit of " +
                        std::to_string(kMaxPayloadBytes) + " B");
  // A sparse message's frames are sized by its row width.
  if (is_sparse(h.op) && h.payload_frames > 0) {
    if (h.chunk == 0 || h.chunk > kMaxRowWidth)
      throw ProtocolError("row width " + std::to_string(h.chunk) + " is not within 1 to " +
                          std::to_string(kMaxRowWidth));
    const std::uint64_t row_bytes = std::uint64_t{h.chunk} * element_bytes(h.dtype);
    if (h.elements > kMaxPayloadBytes / std::max<std::uint64_t>(row_bytes, sizeof(std::uint64_t)))
      throw ProtocolError("payload of " + std::to_string(h.elements) + " rows of " +
                          std::to_string(row_bytes) + " B exceeds the limit of " +
                          std::to_string(kMaxPayloadBytes) + " B per frame");
  }
  return h;
}

std::size_t payload_frame_bytes(const Header& header, std::size_t index, bool reply) {
  if (!is_sparse(header.op)) return header.elements * element_bytes(header.dtype);
  if (!reply && index == 0) return header.elements * sizeof(std::uint64_t);
  return header.elements * header.chunk * element_bytes(header.dtype);
}

void check_payload(const Header& header, std::size_t index, std::size_t frame_bytes, bool reply) {
  if (index >= header.payload_frames)
    throw ProtocolError("payload frame " + std::to_string(index) + " is beyond the " +
                        std::to_string(header.payload_frames) + " the header declares");
  const std::size_t expected = payload_frame_bytes(header, index, reply);
  if (frame_bytes != expected)
    throw ProtocolError("payload frame " + std::to_string(index) + " is " +
                        std::to_string(frame_bytes) + " bytes, but the header declares " +
                        std::to_string(header.elements) + " elements (" + std::to_string(expected) +
                        " bytes)");
}

Header reply_to(const Header& request) {
  Header h;
  h.op = request.op;
  h.request_id = request.request_id;
  // Whose request it was: a primary matches its backup's replies to the
  // forwarded requests by both (server/replicator.h).
  h.sender = request.sender;
  h.incarnation = request.incarnation;
  h.name = request.name;
  h.chunk = request.chunk;
  return h;
}

Header error_reply(const Header& request, std::string text) {
  Header h = reply_to(request);
  h.status = Status::error;
  if (text.size() > kMaxTextBytes) text.resize(kMaxTextBytes);
  h.text = std::move(text);
  return h;
}

}  // namespace pstrain::wire
