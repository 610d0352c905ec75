#pragma once
// Backup workers (mode: backup), as TensorFlow's SyncReplicasOptimizer: each
// step of a chunk, the ps sums the gradients computed on its current version
// in the order they arrive; once it has the first N - b (N: the workers
// still training, b: train.backup_workers, at least one gradient), it applies
// their mean once with the optimizer, which starts the chunk's next version,
// and answers every contributor with the new values. A gradient computed on
// an older version arrives late: it is dropped, counted and answered at once
// with the current values, so its worker goes on from there. The slowest b
// workers of a step never hold it up: a stopped one costs nothing until it
// is lost, and then no longer counts.
//
// Which step a gradient belongs to comes with the push
// (wire::ChunkRequest::base_version: the version its sender last pulled).
// A sender contributes once to a step of a chunk: a second gradient of the
// same step (not a resend: a restarted process of that worker, say) is
// dropped like a late one.
//
// Bounds: per chunk one float sum the chunk's size and one held reply per
// worker, only while a step collects; memory at most the store's values
// once more.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "server/request.h"

namespace pstrain::ps {

class BackupAggregator {
 public:
  explicit BackupAggregator(std::uint32_t backup_workers) : backup_(backup_workers) {}

  // How many gradients a step waits for with `training` workers.
  std::size_t needed(std::size_t training) const;

  enum class Verdict { late, collecting, complete };
  // The gradient of `push` (its payload `grad`) for chunk (`name`, `chunk`),
  // whose version is now `version`: late (an older base version, or its
  // sender contributed already; nothing kept), collecting (summed and its
  // reply held) or complete (summed, and the step has `needed` gradients:
  // take_if_complete() it). Throws std::invalid_argument when the size
  // differs from the step's.
  Verdict add(const Request& push, std::string_view name, std::uint32_t chunk,
              std::uint64_t version, std::span<const float> grad, std::size_t needed);

  struct Step {
    std::string name;
    std::uint32_t chunk = 0;
    std::vector<float> mean;       // of the gradients summed
    std::vector<Request> waiting;  // their held replies
  };
  // The collecting step of a chunk, taken out, once it has `needed`
  // gradients; nullopt otherwise.
  std::optional<Step> take_if_complete(std::string_view name, std::uint32_t chunk,
                                       std::size_t needed);
  // Every collecting step that has `needed` gradients (fewer workers
  // training since: one finished or was lost), taken out.
  std::vector<Step> take_complete(std::size_t needed);

  // A resend of a held reply: retargeted to the resend's peer, as
  // SspGate::retarget. False when no such reply is held.
  bool retarget(const Request& resend);
  // Replies held right now, over every collecting step.
  std::size_t held() const;
  // Drops every collecting step, its held replies unanswered (their senders
  // resend).
  void clear() { steps_.clear(); }

 private:
  struct Collecting {
    std::uint64_t version = 0;
    std::vector<float> sum;
    std::vector<Request> waiting;
  };
  using Key = std::tuple<std::string, std::uint32_t>;
  static Step finish(const Key& key, Collecting& c);

  std::uint32_t backup_;
  std::map<Key, Collecting> steps_;
};

}  // namespace pstrain::ps
