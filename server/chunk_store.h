#pragma once
// The chunks one parameter server holds: values, optimizer state and a
// version (updates applied so far) per (variable name, chunk index).
//
// Values and optimizer state live in reference-counted buffers so a pull can
// hand values to ZeroMQ without a copy, and a checkpoint can hold a chunk's
// values and state while a background thread writes them, each until done.
// An update never writes into a buffer someone else still holds: it copies
// it first (copy-on-write), so a reader sees either the old or the new
// values, never a half-applied update. When nobody else holds the buffers
// the update happens in place.
//
// With apply_threads > 1 a push to a large chunk runs its optimizer on that
// many threads at once (Optimizer::apply, shared/task_pool.h), each on its
// own range; the store is still used by one thread, which waits for them.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shared/optimizer.h"
#include "shared/snapshot.h"
#include "shared/task_pool.h"

namespace pstrain {

using ValueBuffer = std::shared_ptr<std::vector<float>>;
// A buffer as its readers hold it: they never write, the store never writes
// while they hold it.
using SharedFloats = std::shared_ptr<const std::vector<float>>;

struct Chunk {
  ValueBuffer values;
  ValueBuffer state;  // optimizer state, slot-major (shared/optimizer.h)
  std::uint64_t version = 0;
};

// A chunk as it was when taken: references, no copies.
struct HeldChunk {
  std::string name;
  std::uint32_t chunk = 0;
  std::uint64_t version = 0;
  SharedFloats values;
  SharedFloats state;
};
// What the snapshot writer reads of them; valid while `refs` lives.
std::vector<SnapshotRecordView> record_views(const std::vector<HeldChunk>& refs);

struct ChunkStoreStats {
  std::uint64_t updates = 0;
  std::uint64_t copies_on_write = 0;
  double optimizer_seconds = 0;
  double last_optimizer_seconds = 0;  // of the latest push
};

class ChunkStore {
 public:
  // `apply_threads` >= 1 (ps_apply_threads in shared/config.h).
  explicit ChunkStore(OptimizerConfig optimizer, std::uint32_t apply_threads = 1);
  std::uint32_t apply_threads() const;

  // Creates the chunk from `values` if absent. Returns false when it existed
  // with the same size; throws std::invalid_argument when the size differs.
  bool init(std::string_view name, std::uint32_t chunk, std::span<const float> values);

  // nullptr when the chunk does not exist.
  const Chunk* find(std::string_view name, std::uint32_t chunk) const;

  // Both throw std::invalid_argument naming the chunk when it is absent or
  // the sizes differ; both advance the version and return the chunk.
  // `lr_scale` multiplies the optimizer's learning rate (mode backup's
  // linear scaling, server/consistency/backup_aggregator.h; optimizer.
  // staleness_lr, server/consistency/policy.h).
  const Chunk& push(std::string_view name, std::uint32_t chunk, std::span<const float> grad,
                    float lr_scale = 1.0f);
  const Chunk& assign(std::string_view name, std::uint32_t chunk, std::span<const float> values);

  std::size_t size() const { return chunks_.size(); }
  std::uint64_t elements() const;
  std::uint64_t version_sum() const;
  std::uint64_t version_max() const;
  const ChunkStoreStats& stats() const { return stats_; }
  const OptimizerConfig& optimizer() const { return optimizer_.config(); }

  // Every chunk as it is now, by reference: O(chunks), no float is copied.
  std::vector<HeldChunk> refs() const;
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
  // The buffer made exclusive to the store (copied if a pull or a checkpoint
  // holds it).
  std::span<float> writable(ValueBuffer& buffer);

  Optimizer optimizer_;
  std::unique_ptr<TaskPool> pool_;  // with apply_threads > 1
  std::map<Key, Chunk, KeyLess> chunks_;
  ChunkStoreStats stats_;
};

}  // namespace pstrain
