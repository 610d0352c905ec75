#include "server/chunk_store.h"

#include <algorithm>
#include <stdexcept>

#include "shared/trace.h"

namespace pstrain {
namespace {

std::string describe(std::string_view name, std::uint32_t chunk) {
  return "'" + std::string(name) + "' chunk " + std::to_string(chunk);
}

}  // namespace

ChunkStore::ChunkStore(OptimizerConfig optimizer, std::uint32_t apply_threads)
    : optimizer_(optimizer),
      pool_(apply_threads > 1 ? std::make_unique<TaskPool>(apply_threads) : nullptr) {}

std::uint32_t ChunkStore::apply_threads() const {
  return pool_ ? static_cast<std::uint32_t>(pool_->threads()) : 1;
}

bool ChunkStore::init(std::string_view name, std::uint32_t chunk, std::span<const float> values) {
  if (auto it = chunks_.find(KeyView{name, chunk}); it != chunks_.end()) {
    if (it->second.values->size() != values.size())
      throw std::invalid_argument(
          "init of " + describe(name, chunk) + " with " + std::to_string(values.size()) +
          " elements, but the ps holds it with " + std::to_string(it->second.values->size()));
    return false;
  }
  Chunk c;
  c.values = std::make_shared<std::vector<float>>(values.begin(), values.end());
  c.state = std::make_shared<std::vector<float>>(values.size() * optimizer_.state_slots());
  optimizer_.init_state(*c.state);
  chunks_.emplace(Key{std::string(name), chunk}, std::move(c));
  return true;
}

const Chunk* ChunkStore::find(std::string_view name, std::uint32_t chunk) const {
  auto it = chunks_.find(KeyView{name, chunk});
  return it == chunks_.end() ? nullptr : &it->second;
}

Chunk& ChunkStore::existing(std::string_view name, std::uint32_t chunk, std::size_t size) {
  auto it = chunks_.find(KeyView{name, chunk});
  if (it == chunks_.end())
    throw std::invalid_argument("unknown chunk " + describe(name, chunk) +
                                " (not initialized on this ps)");
  if (it->second.values->size() != size)
    throw std::invalid_argument(describe(name, chunk) + " holds " +
                                std::to_string(it->second.values->size()) +
                                " elements, the request carries " + std::to_string(size));
  return it->second;
}

std::span<float> ChunkStore::writable(ValueBuffer& buffer) {
  // use_count() is exact here: only this thread creates references, so the
  // count can only fall while we look. Every other holder (a ZeroMQ message,
  // a checkpoint) lets go on its own thread, ZeroMQ's I/O thread or the
  // checkpoint writer, after reading the buffer, by a decrement with release
  // order. The probe's own decrement, an acquire-release on the same count,
  // orders those reads before our writes when the probe saw nobody else; a
  // relaxed use_count() and an acquire fence would do the same, but
  // ThreadSanitizer cannot see fences and would report a race.
  // An empty buffer (SGD's state) is never written, so never copied.
  bool shared = false;
  {
    const ValueBuffer probe = buffer;
    shared = probe.use_count() > 2 && !buffer->empty();
  }
  if (shared) {
    buffer = std::make_shared<std::vector<float>>(*buffer);
    ++stats_.copies_on_write;
  }
  return *buffer;
}

const Chunk& ChunkStore::push(std::string_view name, std::uint32_t chunk,
                              std::span<const float> grad, float lr_scale) {
  Chunk& c = existing(name, chunk, grad.size());
  const auto start = std::chrono::steady_clock::now();
  optimizer_.apply(writable(c.values), grad, writable(c.state), c.version + 1, lr_scale,
                   pool_.get());
  const auto end = std::chrono::steady_clock::now();
  if (trace::on()) trace::complete("apply", "ps", start, end, name);
  stats_.last_optimizer_seconds = std::chrono::duration<double>(end - start).count();
  stats_.optimizer_seconds += stats_.last_optimizer_seconds;
  ++c.version;
  ++stats_.updates;
  return c;
}

const Chunk& ChunkStore::assign(std::string_view name, std::uint32_t chunk,
                                std::span<const float> values) {
  Chunk& c = existing(name, chunk, values.size());
  std::ranges::copy(values, writable(c.values).begin());
  ++c.version;
  ++stats_.updates;
  return c;
}

std::uint64_t ChunkStore::elements() const {
  std::uint64_t n = 0;
  for (const auto& [key, c] : chunks_) n += c.values->size();
  return n;
}

std::uint64_t ChunkStore::version_sum() const {
  std::uint64_t n = 0;
  for (const auto& [key, c] : chunks_) n += c.version;
  return n;
}

std::uint64_t ChunkStore::version_max() const {
  std::uint64_t n = 0;
  for (const auto& [key, c] : chunks_) n = std::max(n, c.version);
  return n;
}

std::vector<HeldChunk> ChunkStore::refs() const {
  std::vector<HeldChunk> out;
  out.reserve(chunks_.size());
  for (const auto& [key, c] : chunks_)
    out.push_back({key.first, key.second, c.version, c.values, c.state});
  return out;
}

std::vector<SnapshotRecordView> record_views(const std::vector<HeldChunk>& refs) {
  std::vector<SnapshotRecordView> out;
  out.reserve(refs.size());
  for (const auto& r : refs) out.push_back({r.name, r.chunk, r.version, *r.values, *r.state});
  return out;
}

void ChunkStore::restore(std::vector<SnapshotRecord> records) {
  std::map<Key, Chunk, KeyLess> restored;
  for (auto& r : records) {
    const auto where = describe(r.name, r.chunk);
    if (r.state.size() != r.values.size() * optimizer_.state_slots())
      throw std::invalid_argument(where + " has " + std::to_string(r.state.size()) +
                                  " optimizer state floats for " + std::to_string(r.values.size()) +
                                  " values, but optimizer " +
                                  std::string(to_string(optimizer_.config().kind)) + " keeps " +
                                  std::to_string(optimizer_.state_slots()) + " per value");
    Chunk c;
    c.values = std::make_shared<std::vector<float>>(std::move(r.values));
    c.state = std::make_shared<std::vector<float>>(std::move(r.state));
    c.version = r.version;
    if (!restored.emplace(Key{std::move(r.name), r.chunk}, std::move(c)).second)
      throw std::invalid_argument(where + " appears twice");
  }
  chunks_ = std::move(restored);
}

}  // namespace pstrain
