#include "server/request.h"

#include <stdexcept>

namespace pstrain::ps {

std::span<const std::uint8_t> Request::payload_of(wire::DType type) const {
  if (header.payload_frames != 1 || header.dtype != type)
    throw wire::ProtocolError(std::string(wire::to_string(header.op)) +
                              " needs one payload frame of " + std::string(wire::to_string(type)));
  return payload;
}

void Handlers::on(wire::Op op, Handler handler) {
  auto& slot = table_.at(static_cast<std::size_t>(op));
  if (slot) throw std::logic_error("two handlers for op " + std::string(wire::to_string(op)));
  slot = std::move(handler);
}

const Handler* Handlers::find(wire::Op op) const {
  const auto i = static_cast<std::size_t>(op);
  return i < table_.size() && table_[i] ? &table_[i] : nullptr;
}

bool repeats(const Request& resend, const Request& held) {
  const auto &a = resend.header, &b = held.header;
  return a.sender == b.sender && a.incarnation == b.incarnation && a.request_id == b.request_id;
}

}  // namespace pstrain::ps
