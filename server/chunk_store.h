#pragma once
// The chunks one parameter server holds: values, optimizer state and a
// version (updates applied so far) per (variable name, chunk index).
//
// Values live in reference-counted buffers so a pull can hand them to ZeroMQ
// without a copy and keep them alive until the bytes are on the wire. An
// update never writes into a buffer a pull still holds: it copies the values
// first (copy-on-write), so a reader sees either the old or the new values,
// never a half-applied update. When no pull is in flight the update happens
// in place.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shared/snapshot.h"
#include "shared/optimizer.h"

namespace pstrain {

using ValueBuffer = std::shared_ptr<std::vector<float>>;

struct Chunk {
  ValueBuffer values;
  std::vector<float> state;
  std::uint64_t version = 0;
};

struct ChunkStoreStats {
  std::uint64_t updates = 0;
  std::uint64_t copies_on_write = 0;
  double optimizer_seconds = 0;
};

class ChunkStore {
 public:
  explicit ChunkStore(OptimizerConfig optimizer);

  // Creates the chunk from `values` if absent. Returns false when it existed
  // with the same size; throws std::invalid_argument when the size differs.
  bool init(std::string_view name, std::uint32_t chunk, std::span<const float> values);

  // nullptr when the chunk does not exist.
  const Chunk* find(std::string_view name, std::uint32_t chunk) const;

  // Both throw std::invalid_argument naming the chunk when it is absent or
  // the sizes differ; both advance the version and return the chunk.
  const Chunk& push(std::string_view name, std::uint32_t chunk, std::span<const float> grad);
  const Chunk& assign(std::string_view name, std::uint32_t chunk, std::span<const float> values);

  std::size_t size() const { return chunks_.size(); }
  std::uint64_t elements() const;
  std::uint64_t version_sum() const;
  std::uint64_t version_max() const;
  const ChunkStoreStats& stats() const { return stats_; }

  std::vector<SnapshotRecord> records() const;
  // Replaces the contents with `records`; throws std::invalid_argument when a
  // record's state does not fit this store's optimizer.
  void restore(std::vector<SnapshotRecord> records);

 private:
  using Key = std::pair<std::string, std::uint32_t>;
  using KeyView = std::pair<std::string_view, std::uint32_t>;
  // Looks chunks up by a string_view without building a std::string.
  struct KeyLess {
    using is_transparent = void;
    static KeyView view(const Key& k) { return {k.first, k.second}; }
    static KeyView view(const KeyView& k) { return k; }
    bool operator()(const auto& a, const auto& b) const { return view(a) < view(b); }
  };
  Chunk& existing(std::string_view name, std::uint32_t chunk, std::size_t size);
  // The chunk's values, made exclusive to the store (copied if a pull holds them).
  std::span<float> writable(Chunk& c);

  Optimizer optimizer_;
  std::map<Key, Chunk, KeyLess> chunks_;
  ChunkStoreStats stats_;
};

}  // namespace pstrain
