#include "server/update_payload.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "shared/all_finite.h"
#include "shared/gradient_compression.h"
#include "shared/log.h"

namespace pstrain::ps {

FloatPayload::FloatPayload(const Request& request, std::span<const std::uint8_t> bytes,
                           bool halves_allowed, std::size_t dense) {
  const auto type = request.header.dtype;
  if (wire::is_compressed(type) && dense > 0) {
    copy_.resize(dense);
    try {
      decompress(type == wire::DType::topk ? Compression::Kind::topk : Compression::Kind::sign,
                 bytes, copy_);
    } catch (const std::invalid_argument& e) {
      throw wire::ProtocolError(std::string(wire::to_string(request.header.op)) + ": " + e.what());
    }
    view_ = copy_;
    return;
  }
  const auto half = wire::half_format(type);
  if (!wire::is_float(type) || (half && !halves_allowed))
    throw wire::ProtocolError(std::string(wire::to_string(request.header.op)) +
                              " carries values as " +
                              (halves_allowed ? "f32, bf16 or fp16" : "f32 (stored exactly)") +
                              ", not " + std::string(wire::to_string(type)));
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
    // An empty vector's data() may be null, which memcpy must not get even
    // for 0 bytes.
    if (n > 0) std::memcpy(copy_.data(), bytes.data(), n * sizeof(float));
    view_ = copy_;
  }
}

void NonfiniteRefusal::check(const Request& request, std::span<const float> values) {
  if (all_finite(values)) return;
  stats_.nonfinite_refused();
  const auto sender = request.header.sender;
  if (logged_.size() < kMaxLogged && logged_.insert(sender).second)
    log("refused a ", wire::to_string(request.header.op),
        " with NaN or infinite values from sender ", sender,
        "; later ones from it are only counted (stats: nonfinite_refused)");
  throw std::invalid_argument("NaN or infinite values; nothing was stored");
}

}  // namespace pstrain::ps
