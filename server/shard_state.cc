#include "server/shard_state.h"

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <sstream>
#include <string>

#include "shared/protocol.h"

namespace pstrain {

template <class Archive>
void serialize(Archive& ar, SnapshotRecord& r) {
  ar(r.name, r.chunk, r.version, r.values, r.state);
}

namespace ps {

template <class Archive>
void serialize(Archive& ar, Dedup::ClientRecord& r) {
  ar(r.incarnation, r.sender, r.evicted_below, r.applied);
}

namespace {
// Told apart from anything else a frame may hold.
constexpr std::uint32_t kMagic = 0x50535353;  // "PSSS"
}  // namespace

std::uint64_t ShardState::version_sum() const {
  std::uint64_t sum = 0;
  for (const auto& c : chunks) sum += c.version;
  return sum;
}

std::vector<std::uint8_t> encode_shard_state(const std::vector<HeldChunk>& chunks,
                                             const Dedup& record) {
  // One copy into the archive: the chunks are the store's buffers, which
  // the next update may change (copy-on-write keeps them meanwhile).
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive ar(out);
    ar(kMagic, static_cast<std::uint64_t>(chunks.size()));
    for (const auto& c : chunks) {
      SnapshotRecord r{c.name, c.chunk, c.version, *c.values,
                       c.state ? *c.state : std::vector<float>{}};
      ar(r);
    }
    ar(record.records());
  }
  const std::string bytes = std::move(out).str();
  if (bytes.size() > wire::kMaxPayloadBytes)
    throw ShardStateError("the shard's state is " + std::to_string(bytes.size()) +
                          " bytes, more than the " + std::to_string(wire::kMaxPayloadBytes) +
                          " one message carries");
  return {bytes.begin(), bytes.end()};
}

ShardState decode_shard_state(std::span<const std::uint8_t> bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  ShardState state;
  try {
    cereal::BinaryInputArchive ar(in);
    std::uint32_t magic = 0;
    std::uint64_t count = 0;
    ar(magic, count);
    if (magic != kMagic) throw ShardStateError("not a shard's state (its first bytes differ)");
    // Every record takes more than one byte: a count beyond the frame's
    // size is a lie that must not size an allocation.
    if (count > bytes.size()) throw ShardStateError("its chunk count exceeds its size");
    state.chunks.resize(count);
    for (auto& c : state.chunks) ar(c);
    ar(state.record);
  } catch (const ShardStateError&) {
    throw;
  } catch (const std::exception& e) {
    throw ShardStateError(std::string("a shard's state that does not decode: ") + e.what());
  }
  if (in.peek() != std::char_traits<char>::eof())
    throw ShardStateError("a shard's state with bytes after its end");
  return state;
}

}  // namespace ps
}  // namespace pstrain
