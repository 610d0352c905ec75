#pragma once
// Batches from a worker's shard into its model's input, double-buffered in
// pinned memory on backends the host cannot reach.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "client/compute/backend.h"
#include "client/data/dataset.h"

namespace pstrain {

class Model;

// Puts batches into the model's input and reads back their losses, and
// keeps the ids of a dataset that has them (for the embedding exchange). On
// backends the host cannot reach, batches are assembled in two pinned buffers
// in turn: the next one is gathered (stage_next) while the device computes on
// the current one, and load() only issues its upload.
class BatchFeeder {
 public:
  BatchFeeder(Backend& backend, Model& model, WorkerShard& shard, std::size_t batch_size);

  // Puts the next batch into the model's input buffers (uploads the staged
  // batch on backends the host cannot reach).
  Batch load();
  // The ids of the batch load() returned (batch x ids_per_sample), until the
  // next load().
  std::span<const std::uint64_t> ids() const;
  // Gathers the batch after the one load() returned into the other pinned
  // buffer; call it once the step's compute has been issued. A no-op where
  // the host writes the model's input directly.
  void stage_next();
  // Issues the download of the last batch's per-sample losses; on such
  // backends they are readable after the next fence has completed.
  void fetch_losses();
  // Mean loss of the last batch, once fetch_losses' data has arrived.
  double mean_loss() const;

 private:
  Backend& backend_;
  Model& model_;
  WorkerShard& shard_;
  std::size_t batch_size_;
  bool direct_;
  struct Staged {
    HostMemory images, labels;
    std::vector<std::uint64_t> ids;
    Batch batch;
    bool ready = false;
  };
  Staged staged_[2];
  int next_ = 0;                    // the staging buffer load() takes next
  const Staged* loaded_ = nullptr;  // the one load() returned
  HostMemory host_loss_;
  const float* losses_;
  std::size_t last_ = 0;
};

}  // namespace pstrain
