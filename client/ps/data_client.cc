#include "client/ps/data_client.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "shared/init.h"
#include "shared/messages.h"

namespace pstrain {

using wire::Header;
using wire::Op;

namespace {

template <class T>
std::span<const std::uint8_t> bytes_of(std::span<const T> values) {
  return {reinterpret_cast<const std::uint8_t*>(values.data()), values.size_bytes()};
}

wire::DType wire_type(WireDType type) {
  switch (type) {
    case WireDType::bf16:
      return wire::DType::bf16;
    case WireDType::fp16:
      return wire::DType::fp16;
    case WireDType::fp32:
      break;
  }
  return wire::DType::f32;
}

}  // namespace

PsDataClient::PsDataClient(PsChannel& channel, ShardMap map)
    : channel_(channel),
      map_(std::move(map)),
      wire_dtype_(wire_type(channel.options().wire_dtype)),
      pulled_version_(map_.all_chunks().size(), 0),
      staleness_(map_.variables().size(), 0.0) {
  if (channel.servers() != map_.servers())
    throw std::invalid_argument("ps client: " + std::to_string(channel.servers()) +
                                " ps addresses but the shard map has " +
                                std::to_string(map_.servers()) + " servers");
}

std::uint32_t PsDataClient::variable_index(std::string_view name) const {
  const auto v = map_.find(name);
  if (!v) throw PsError("ps client: unknown variable '" + std::string(name) + "'");
  return *v;
}

void PsDataClient::init(std::uint64_t seed) {
  std::vector<std::vector<float>> values;  // alive until the replies are in
  values.reserve(map_.all_chunks().size());
  const Ticket id = channel_.open(Op::init, "all variables", channel_.options().timeout_s);
  for (const auto& c : map_.all_chunks()) {
    const auto& var = map_.variables()[c.variable];
    auto& v = values.emplace_back(c.count);
    init_fill(v, seed, var.name, c.offset, var.init);
    Header h;
    h.op = Op::init;
    wire::ChunkRequest{var.name, c.index}.write(h);
    channel_.send(id, c.server, std::move(h), bytes_of(std::span<const float>(v)));
  }
  channel_.wait(id);
}

PsDataClient::Ticket PsDataClient::chunk_op(Op op, std::string_view name,
                                            std::span<const float> grad, std::span<float> out,
                                            std::size_t given) {
  const auto v = variable_index(name);
  const auto size = map_.variables()[v].size;
  if (given != size)
    throw std::invalid_argument("ps client: " + std::string(wire::to_string(op)) + " of '" +
                                std::string(name) + "': buffer of " + std::to_string(given) +
                                " floats, the variable has " + std::to_string(size));
  const Ticket id = channel_.open(op, std::string(name), channel_.options().timeout_s);
  Call& call = calls_[id];
  call.variable = v;
  call.out = out.empty() ? nullptr : out.data();
  const auto half = wire::half_format(wire_dtype_);
  if (half && !grad.empty()) {
    call.halves.resize(grad.size());
    encode_halves(*half, grad.data(), call.halves.data(), grad.size());
  }
  for (const auto& c : map_.chunks(v)) {
    Header h;
    h.op = op;
    h.dtype = wire_dtype_;
    const auto g = static_cast<std::size_t>(&c - map_.all_chunks().data());
    wire::ChunkRequest{map_.variables()[v].name, c.index, clock_, pulled_version_[g], v}.write(h);
    std::span<const std::uint8_t> payload;
    if (half && !grad.empty()) {
      payload = bytes_of(std::span<const std::uint16_t>(call.halves).subspan(c.offset, c.count));
    } else if (!grad.empty()) {
      payload = bytes_of(grad.subspan(c.offset, c.count));
    }
    channel_.send(id, c.server, std::move(h), payload, {}, this, g);
  }
  return id;
}

void PsDataClient::on_reply(Ticket ticket, std::uint64_t cookie, const Header& h,
                            std::span<const std::uint8_t> payload) {
  Call& call = calls_.at(ticket);
  const auto& c = map_.all_chunks()[cookie];
  const auto version = wire::ChunkReply::read(h).version;
  if (h.op == Op::push || h.op == Op::push_pull) {
    const auto before = version == 0 ? 0 : version - 1;
    call.staleness_sum += static_cast<double>(before - std::min(before, pulled_version_[cookie]));
    ++call.staleness_chunks;
  }
  if (h.op == Op::pull || h.op == Op::push_pull) {
    if (h.payload_frames != 1 || h.dtype != wire_dtype_ || h.elements != c.count)
      throw PsError("chunk " + std::to_string(c.index) + " reply carries " +
                    std::to_string(h.elements) + " values of " +
                    std::string(wire::to_string(h.dtype)) + ", expected " +
                    std::to_string(c.count) + " of " + std::string(wire::to_string(wire_dtype_)));
    if (const auto half = wire::half_format(h.dtype)) {
      wire::widen(*half, payload, call.out + c.offset);
    } else {
      std::memcpy(call.out + c.offset, payload.data(), payload.size());
    }
    pulled_version_[cookie] = version;
  }
}

PsDataClient::Ticket PsDataClient::pull(std::string_view variable, std::span<float> out) {
  return chunk_op(Op::pull, variable, {}, out, out.size());
}

PsDataClient::Ticket PsDataClient::push(std::string_view variable, std::span<const float> grad) {
  return chunk_op(Op::push, variable, grad, {}, grad.size());
}

PsDataClient::Ticket PsDataClient::push_pull(std::string_view variable, std::span<const float> grad,
                                             std::span<float> out) {
  if (grad.size() != out.size())
    throw std::invalid_argument("ps client: push_pull of '" + std::string(variable) +
                                "': " + std::to_string(grad.size()) + " gradients but " +
                                std::to_string(out.size()) + " output floats");
  return chunk_op(Op::push_pull, variable, grad, out, grad.size());
}

PsDataClient::Ticket PsDataClient::assign(std::string_view variable,
                                          std::span<const float> values) {
  return chunk_op(Op::assign, variable, values, {}, values.size());
}

void PsDataClient::wait(Ticket ticket) {
  const auto it = calls_.find(ticket);
  if (it == calls_.end()) {
    channel_.wait(ticket);  // unknown to the channel too, or already waited for
    return;
  }
  // The call's state (its rounded gradient) goes once the channel has
  // released its frames, which wait() does before it returns or throws.
  struct Erase {
    std::unordered_map<Ticket, Call>& calls;
    std::unordered_map<Ticket, Call>::iterator it;
    ~Erase() { calls.erase(it); }
  } erase{calls_, it};
  channel_.wait(ticket);
  const Call& call = it->second;
  if (call.staleness_chunks > 0)
    staleness_[call.variable] = call.staleness_sum / static_cast<double>(call.staleness_chunks);
}

void PsDataClient::wait_all() {
  while (!calls_.empty()) wait(calls_.begin()->first);
}

void PsDataClient::abandon_all() {
  channel_.abandon_all();
  // Payloads in a call's own memory (rounded gradients) go with it.
  calls_.clear();
}

double PsDataClient::last_staleness(std::string_view variable) const {
  return staleness_[variable_index(variable)];
}

}  // namespace pstrain
