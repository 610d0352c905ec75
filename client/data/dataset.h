#pragma once
// Training and test data held in host memory, and each worker's view of the
// training set.
//
// The image datasets are NCHW (1x28x28) float32 in [0, 1] with int32 labels
// in [0, classes). A dataset may carry ids per sample for embedding layers
// (docs/embeddings.md) beside its features, or instead of them. The click
// datasets (criteo, synthetic-ctr: docs/ctr.md) hold 13 dense features as
// 13x1x1 "images", 26 ids and labels 0/1.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "client/data/idx_reader.h"
#include "shared/config.h"

namespace pstrain {

struct Dataset {
  std::string name;  // "fashion-mnist/train", "synthetic/test", ...
  int channels = 1, height = 28, width = 28;
  int classes = 10;
  std::vector<float> images;         // size() * sample_floats()
  std::vector<std::int32_t> labels;  // size()

  // Ids for embedding layers, sample-major: size() x ids_per_sample.
  std::size_t ids_per_sample = 0;
  std::vector<std::uint64_t> ids;

  // 0: the dataset is a whole split, and WorkerShard gives worker w of N
  // its part w. > 0: it holds one worker's own samples already (criteo's
  // training split), and WorkerShard trains on its first part_size.
  std::size_t part_size = 0;
  // criteo: malformed lines skipped (data.skip_bad_lines) in this part.
  std::uint64_t skipped_lines = 0;
  // synthetic-ctr, test split: the planted teacher's own AUC and log loss on
  // these samples, the best a model can do; -1: unknown.
  double ceiling_auc = -1, ceiling_logloss = -1;
  // synthetic-ctr: the 13 integers each sample's dense features were made
  // from, sample-major (missing: kCtrMissingInteger, criteo_reader.h), for
  // write_criteo_tsv. Empty for other datasets.
  std::vector<std::int32_t> raw_integers;

  std::size_t size() const { return labels.size(); }
  std::size_t sample_floats() const { return static_cast<std::size_t>(channels) * height * width; }
  const float* image(std::size_t i) const { return images.data() + i * sample_floats(); }
  const std::uint64_t* sample_ids(std::size_t i) const { return ids.data() + i * ids_per_sample; }
};

// Fashion-MNIST's `train` (60,000) or `t10k` (10,000) split from the four
// *-ubyte.gz files in `dir`. Throws DataError naming the file, what is wrong
// and how to get the files (Debian's dataset-fashion-mnist, or data.dir).
Dataset load_fashion_mnist(const std::filesystem::path& dir, bool train);

// A learnable stand-in for fast tests: each class is a fixed random pattern of
// blobs, each sample its class's pattern at a random brightness plus noise.
// The patterns depend only on the class, the samples on (split, index), so
// the train and test splits share classes but no samples.
Dataset make_synthetic(std::size_t size, bool train);

// A stand-in with ids for embedding layers: each sample has kSyntheticIdFields
// ids, field f's drawn uniformly from kSyntheticIdVocab ids of its own
// (f * vocab + v), each id with a hidden sign fixed by its value; the label
// (2 classes) says whether most of a sample's signs are positive. No other
// features. Samples depend on (split, index) only.
inline constexpr std::size_t kSyntheticIdFields = 3, kSyntheticIdVocab = 1000;
Dataset make_synthetic_ids(std::size_t size, bool train);

// The dataset DataConfig names (fashion-mnist, synthetic, synthetic-ids,
// criteo or synthetic-ctr), train or test. For worker `worker` of `workers`:
// criteo's training split is read as that worker's part (part_size > 0,
// client/data/criteo_reader.h); every other dataset, and every test split,
// is whole. Throws DataError for missing or malformed files,
// std::invalid_argument for an unknown name.
Dataset load_dataset(const DataConfig& config, bool train, std::uint32_t worker = 0,
                     std::uint32_t workers = 1);

// What a model must know of a data set before loading it: a sample's
// features (channels x height x width), the classes and the ids per sample.
// `pstrain --check` builds the model from it.
struct DataShape {
  int channels = 1, height = 28, width = 28;
  int classes = 10;
  std::size_t ids_per_sample = 0;
};
DataShape data_shape(const DataConfig& config);

struct Batch {
  std::size_t size = 0;     // samples copied; 0 never happens
  std::uint64_t epoch = 0;  // the epoch the batch belongs to
  std::size_t index = 0;    // the batch's number within its epoch
};

// Worker `worker` of `workers` owns the contiguous part
// [worker * part, (worker + 1) * part) of the training set, with
// part = size / workers: every worker gets the same number of samples, so in
// sync mode all take the same number of steps (the < workers samples left
// over are not used). A dataset with part_size > 0 holds this worker's own
// samples already: the worker owns its first part_size, [0, part_size)
// (the loader made part_size the same for every worker). Each epoch visits
// the part in a new order, a pure function of (seed, worker, epoch). The
// last batch of an epoch is smaller when the batch size does not divide the
// part: it is kept, so an epoch sees every owned sample exactly once.
class WorkerShard {
 public:
  // Keeps a reference to `data`, which must outlive the shard. Throws
  // std::invalid_argument when the dataset has fewer samples than
  // workers (with part_size > 0: fewer than part_size), or
  // worker >= workers.
  WorkerShard(const Dataset& data, std::uint32_t worker, std::uint32_t workers, std::uint64_t seed);

  const Dataset& data() const { return data_; }
  std::size_t size() const { return part_; }
  std::size_t first() const { return first_; }  // first owned sample
  std::size_t batches_per_epoch(std::size_t batch_size) const {
    return (size() + batch_size - 1) / batch_size;
  }

  // Copies the next up to `batch_size` samples into images (batch_size *
  // sample_floats floats), labels (batch_size) and, when not null, ids
  // (batch_size * ids_per_sample), moving to the next epoch (and its order)
  // when the current one is used up.
  Batch next_batch(std::size_t batch_size, float* images, std::int32_t* labels,
                   std::uint64_t* ids = nullptr);
  // The ids of the batch next_batch(batch_size) would return, without
  // moving: what a prefetch of its embedding rows needs. Returns its size.
  std::size_t peek_ids(std::size_t batch_size, std::vector<std::uint64_t>& ids) const;

  // Puts the shard where `batches` calls of next_batch(batch_size) on a fresh
  // shard leave it (epoch, position and batch number), without reading any
  // samples: a sync-mode worker that restarts at step s seeks to s batches
  // and goes on with the batch it would have read next. Throws
  // std::invalid_argument when batch_size is 0.
  void seek(std::uint64_t batches, std::size_t batch_size);

  // The order of the owned samples (dataset indices) in `epoch`.
  std::vector<std::size_t> epoch_order(std::uint64_t epoch) const;

 private:
  const Dataset& data_;
  std::uint32_t worker_;
  std::uint64_t seed_;
  std::size_t part_;
  std::size_t first_;
  std::uint64_t epoch_ = 0;
  std::size_t position_ = 0;  // next sample of order_
  std::size_t batch_index_ = 0;
  std::vector<std::size_t> order_;
};

}  // namespace pstrain
