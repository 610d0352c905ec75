#include "client/ps/data_client.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "shared/init.h"
#include "shared/low_precision.h"
#include "shared/messages.h"
#include "shared/trace.h"

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
      staleness_(map_.variables().size(), 0.0),
      compression_(channel.options().compression),
      carried_(map_.variables().size()) {
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
  {
    const PsChannel::Batch batch(channel_);
    for (const auto& c : map_.all_chunks()) {
      const auto& var = map_.variables()[c.variable];
      auto& v = values.emplace_back(c.count);
      init_fill(v, seed, var.name, c.offset, var.init);
      Header h;
      h.op = Op::init;
      wire::ChunkRequest{var.name, c.index}.write(h);
      channel_.send(id, c.server, std::move(h), bytes_of(std::span<const float>(v)));
    }
  }  // the batch leaves
  channel_.wait(id);
}

std::size_t PsDataClient::first_chunk(std::uint32_t v) const {
  return static_cast<std::size_t>(map_.chunks(v).data() - map_.all_chunks().data());
}

std::size_t PsDataClient::chunk_count(std::string_view variable) const {
  return map_.chunks(variable_index(variable)).size();
}

void PsDataClient::adopt_versions(std::string_view variable,
                                  std::span<const std::uint64_t> versions) {
  const auto v = variable_index(variable);
  if (versions.size() != map_.chunks(v).size())
    throw std::invalid_argument("ps client: versions of '" + std::string(variable) + "': " +
                                std::to_string(versions.size()) + " given, the variable has " +
                                std::to_string(map_.chunks(v).size()) + " chunks");
  std::ranges::copy(versions,
                    pulled_version_.begin() + static_cast<std::ptrdiff_t>(first_chunk(v)));
}

PsDataClient::Ticket PsDataClient::chunk_op(Op op, std::string_view name,
                                            std::span<const float> grad, std::span<float> out,
                                            std::size_t given, std::span<std::uint64_t> versions,
                                            ReceivedValues* received) {
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
  call.received = received;
  call.versions = versions.empty() ? nullptr : versions.data();
  const auto first = first_chunk(v);
  if (!grad.empty())
    call.basis.assign(
        pulled_version_.begin() + static_cast<std::ptrdiff_t>(first),
        pulled_version_.begin() + static_cast<std::ptrdiff_t>(first + map_.chunks(v).size()));
  const bool compressed = compression_.kind != Compression::Kind::none && !grad.empty() &&
                          (op == Op::push || op == Op::push_pull);
  const auto half = compressed ? std::nullopt : wire::half_format(wire_dtype_);
  if (half && !grad.empty()) {
    call.halves.resize(grad.size());
    encode_halves(*half, grad.data(), call.halves.data(), grad.size());
  }
  if (compressed) compress_chunks(v, grad, call);
  const PsChannel::Batch batch(channel_);
  for (const auto& c : map_.chunks(v)) {
    Header h;
    h.op = op;
    h.dtype = wire_dtype_;
    const auto g = static_cast<std::size_t>(&c - map_.all_chunks().data());
    wire::ChunkRequest{map_.variables()[v].name, c.index, clock_, pulled_version_[g], v}.write(h);
    std::span<const std::uint8_t> payload;
    if (compressed) {
      h.dtype =
          compression_.kind == Compression::Kind::topk ? wire::DType::topk : wire::DType::sign;
      payload = call.compressed[c.index];
    } else if (half && !grad.empty()) {
      payload = bytes_of(std::span<const std::uint16_t>(call.halves).subspan(c.offset, c.count));
    } else if (!grad.empty()) {
      payload = bytes_of(grad.subspan(c.offset, c.count));
    }
    if (op == Op::push || op == Op::push_pull) push_volume_.sent += payload.size();
    channel_.send(id, c.server, std::move(h), payload, {}, this, g);
  }
  if (op == Op::push || op == Op::push_pull) push_volume_.float32 += grad.size_bytes();
  return id;
}

void PsDataClient::compress_chunks(std::uint32_t v, std::span<const float> grad, Call& call) {
  auto& carried = carried_[v];
  if (carried.empty()) carried.assign(grad.size(), 0.0f);
  const auto chunks = map_.chunks(v);
  call.compressed.resize(chunks.size());
  for (const auto& c : chunks) {
    const std::span<float> part = std::span<float>(carried).subspan(c.offset, c.count);
    const auto g = grad.subspan(c.offset, c.count);
    for (std::size_t i = 0; i < part.size(); ++i) part[i] += g[i];
    compress(compression_, part, call.compressed[c.index], part);
  }
}

PsDataClient::Ticket PsDataClient::sparse_op(Op op, std::string_view table,
                                             std::span<const std::uint64_t> keys,
                                             std::span<const float> grads, std::span<float> out) {
  const auto& options = channel_.options();
  const auto spec = std::ranges::find(options.tables, table, &TableSpec::name);
  if (spec == options.tables.end())
    throw std::invalid_argument("ps client: no embedding table '" + std::string(table) + "'");
  const std::size_t dim = spec->dim;
  const bool pushes = op != Op::sparse_pull;
  const bool pulls = op != Op::sparse_push;
  if ((pushes && grads.size() != keys.size() * dim) || (pulls && out.size() != keys.size() * dim))
    throw std::invalid_argument("ps client: " + std::string(wire::to_string(op)) + " of '" +
                                std::string(table) + "': " + std::to_string(keys.size()) +
                                " rows of " + std::to_string(dim) + " need " +
                                std::to_string(keys.size() * dim) + " floats");
  const Ticket id = channel_.open(op, std::string(table), options.timeout_s);
  Call& call = calls_[id];
  call.out = out.empty() ? nullptr : out.data();
  call.dim = spec->dim;
  // Each ps's rows, in requests of at most one frame's worth (the rows'
  // frame is the larger one unless rows are narrower than an id).
  const auto half = wire::half_format(wire_dtype_);
  const std::size_t row_bytes = dim * wire::element_bytes(wire_dtype_);
  const std::size_t max_rows = wire::kMaxPayloadBytes / std::max(row_bytes, sizeof(std::uint64_t));
  std::vector<std::size_t> open_part(channel_.servers(), SIZE_MAX);  // per ps
  std::vector<std::uint32_t> part_server;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto s = row_home(keys[i], channel_.servers(), options.table_seed);
    if (open_part[s] == SIZE_MAX || call.parts[open_part[s]].keys.size() == max_rows) {
      open_part[s] = call.parts.size();
      call.parts.emplace_back();
      part_server.push_back(s);
    }
    SparsePart& part = call.parts[open_part[s]];
    part.keys.push_back(keys[i]);
    part.places.push_back(static_cast<std::uint32_t>(i));
    if (!pushes) continue;
    const auto g = grads.subspan(i * dim, dim);
    const auto at = part.grads.size();
    part.grads.resize(at + row_bytes);
    if (half)
      encode_halves(*half, g.data(), reinterpret_cast<std::uint16_t*>(part.grads.data() + at), dim);
    else
      std::memcpy(part.grads.data() + at, g.data(), row_bytes);
  }
  // Sent once every part is built: their buffers no longer move.
  const PsChannel::Batch batch(channel_);
  for (std::size_t p = 0; p < call.parts.size(); ++p) {
    Header h;
    h.op = op;
    h.dtype = wire_dtype_;
    wire::SparseRequest{spec->name, spec->dim, clock_}.write(h);
    channel_.send(id, part_server[p], std::move(h),
                  bytes_of(std::span<const std::uint64_t>(call.parts[p].keys)), {}, this, p,
                  call.parts[p].grads);
  }
  return id;
}

PsDataClient::Ticket PsDataClient::sparse_pull(std::string_view table,
                                               std::span<const std::uint64_t> keys,
                                               std::span<float> out) {
  return sparse_op(Op::sparse_pull, table, keys, {}, out);
}

PsDataClient::Ticket PsDataClient::sparse_push(std::string_view table,
                                               std::span<const std::uint64_t> keys,
                                               std::span<const float> grads) {
  return sparse_op(Op::sparse_push, table, keys, grads, {});
}

PsDataClient::Ticket PsDataClient::sparse_push_pull(std::string_view table,
                                                    std::span<const std::uint64_t> keys,
                                                    std::span<const float> grads,
                                                    std::span<float> out) {
  return sparse_op(Op::sparse_push_pull, table, keys, grads, out);
}

void PsDataClient::take_rows(Call& call, const SparsePart& part, const Header& h,
                             std::span<const std::uint8_t> payload) {
  if (h.op == Op::sparse_push) return;
  if (h.payload_frames != 1 || h.dtype != wire_dtype_ || h.elements != part.keys.size() ||
      h.chunk != call.dim)
    throw PsError("reply carries " + std::to_string(h.elements) + " rows of " +
                  std::to_string(h.chunk) + " " + std::string(wire::to_string(h.dtype)) +
                  ", expected " + std::to_string(part.keys.size()) + " of " +
                  std::to_string(call.dim) + " " + std::string(wire::to_string(wire_dtype_)));
  const std::size_t row_bytes = call.dim * wire::element_bytes(h.dtype);
  const auto half = wire::half_format(h.dtype);
  for (std::size_t k = 0; k < part.keys.size(); ++k) {
    const auto row = payload.subspan(k * row_bytes, row_bytes);
    float* to = call.out + std::size_t{part.places[k]} * call.dim;
    if (half)
      wire::widen(*half, row, to);
    else
      std::memcpy(to, row.data(), row.size());
  }
}

void PsDataClient::on_reply(Ticket ticket, std::uint64_t cookie, const Header& h,
                            std::span<const std::uint8_t> payload, zmq::message_t* message) {
  Call& call = calls_.at(ticket);
  if (wire::is_sparse(h.op)) return take_rows(call, call.parts.at(cookie), h, payload);
  const auto& c = map_.all_chunks()[cookie];
  const auto version = wire::ChunkReply::read(h).version;
  const auto place = cookie - first_chunk(call.variable);
  if (h.op == Op::push || h.op == Op::push_pull) {
    const auto before = version == 0 ? 0 : version - 1;
    call.staleness_sum += static_cast<double>(before - std::min(before, call.basis[place]));
    ++call.staleness_chunks;
  }
  if (h.op == Op::pull || h.op == Op::push_pull) {
    const TraceSpan span("copy reply", "comm");
    // A compressed push's new values come as float32.
    const auto expected = h.op == Op::push_pull && compression_.kind != Compression::Kind::none
                              ? wire::DType::f32
                              : wire_dtype_;
    if (h.payload_frames != 1 || h.dtype != expected || h.elements != c.count)
      throw PsError("chunk " + std::to_string(c.index) + " reply carries " +
                    std::to_string(h.elements) + " values of " +
                    std::string(wire::to_string(h.dtype)) + ", expected " +
                    std::to_string(c.count) + " of " + std::string(wire::to_string(expected)));
    // Kept in its message where the caller reads them later (no copy).
    const auto half = wire::half_format(h.dtype);
    const bool kept =
        call.received && !half && message && call.received->keep(c.offset, c.count, *message);
    if (!kept) {
      float* to =
          call.received ? call.received->buffer_for(c.offset, c.count).data() : call.out + c.offset;
      if (half)
        wire::widen(*half, payload, to);
      else
        std::memcpy(to, payload.data(), payload.size());
    }
    (call.versions ? call.versions[place] : pulled_version_[cookie]) = version;
  }
}

PsDataClient::Ticket PsDataClient::pull(std::string_view variable, std::span<float> out) {
  return chunk_op(Op::pull, variable, {}, out, out.size());
}

PsDataClient::Ticket PsDataClient::push(std::string_view variable, std::span<const float> grad) {
  return chunk_op(Op::push, variable, grad, {}, grad.size());
}

void PsDataClient::check_version_slots(std::string_view variable,
                                       std::span<const std::uint64_t> versions) const {
  if (!versions.empty() && versions.size() != chunk_count(variable))
    throw std::invalid_argument("ps client: push_pull of '" + std::string(variable) +
                                "': " + std::to_string(versions.size()) +
                                " version slots, the variable has " +
                                std::to_string(chunk_count(variable)) + " chunks");
}

PsDataClient::Ticket PsDataClient::push_pull(std::string_view variable, std::span<const float> grad,
                                             std::span<float> out) {
  return push_pull(variable, grad, out, {});
}

PsDataClient::Ticket PsDataClient::push_pull(std::string_view variable, std::span<const float> grad,
                                             std::span<float> out,
                                             std::span<std::uint64_t> versions) {
  check_version_slots(variable, versions);
  if (grad.size() != out.size())
    throw std::invalid_argument("ps client: push_pull of '" + std::string(variable) +
                                "': " + std::to_string(grad.size()) + " gradients but " +
                                std::to_string(out.size()) + " output floats");
  return chunk_op(Op::push_pull, variable, grad, out, grad.size(), versions);
}

PsDataClient::Ticket PsDataClient::push_pull(std::string_view variable, std::span<const float> grad,
                                             ReceivedValues& into,
                                             std::span<std::uint64_t> versions) {
  if (into.size() != grad.size())
    throw std::invalid_argument("ps client: push_pull of '" + std::string(variable) +
                                "': " + std::to_string(grad.size()) + " gradients but " +
                                std::to_string(into.size()) + " values received into");
  check_version_slots(variable, versions);
  return chunk_op(Op::push_pull, variable, grad, {}, grad.size(), versions, &into);
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
