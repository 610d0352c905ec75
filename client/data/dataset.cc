#include "client/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "client/data/criteo_reader.h"
#include "client/data/synthetic_ctr.h"

namespace pstrain {
namespace {

// splitmix64: a small, portable generator, so data orders and synthetic
// samples are the same with every standard library.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  float uniform() {  // [0, 1)
    return static_cast<float>(next() >> 40) * 0x1.0p-24f;
  }
  std::size_t below(std::size_t bound) {  // [0, bound); bias < bound / 2^64
    return static_cast<std::size_t>(next() % bound);
  }

 private:
  std::uint64_t state_;
};

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  return Random(a ^ (b * 0x9e3779b97f4a7c15ULL)).next();
}

const char* const kFashionHint = "; install Debian's dataset-fashion-mnist package or set data.dir";

}  // namespace

Dataset load_fashion_mnist(const std::filesystem::path& dir, bool train) {
  const std::string split = train ? "train" : "t10k";
  const auto images_path = dir / (split + "-images-idx3-ubyte.gz");
  const auto labels_path = dir / (split + "-labels-idx1-ubyte.gz");
  IdxArray images, labels;
  try {
    images = read_idx(images_path, 3);
    labels = read_idx(labels_path, 1);
  } catch (const DataError& e) {
    throw DataError(std::string("data: ") + e.what() + kFashionHint);
  }
  if (images.dims[1] != 28 || images.dims[2] != 28) {
    throw DataError("data: " + images_path.string() + ": images are " +
                    std::to_string(images.dims[1]) + "x" + std::to_string(images.dims[2]) +
                    ", expected 28x28" + kFashionHint);
  }
  if (images.dims[0] != labels.dims[0]) {
    throw DataError("data: " + images_path.string() + " holds " + std::to_string(images.dims[0]) +
                    " images but " + labels_path.string() + " " + std::to_string(labels.dims[0]) +
                    " labels" + kFashionHint);
  }

  Dataset data;
  data.name = "fashion-mnist/" + std::string(train ? "train" : "test");
  data.images.resize(images.values.size());
  std::transform(images.values.begin(), images.values.end(), data.images.begin(),
                 [](std::uint8_t v) { return static_cast<float>(v) / 255.0f; });
  data.labels.resize(labels.values.size());
  for (std::size_t i = 0; i < labels.values.size(); ++i) {
    if (labels.values[i] >= data.classes) {
      throw DataError("data: " + labels_path.string() + ": label " +
                      std::to_string(labels.values[i]) + " of sample " + std::to_string(i) +
                      " is not a class in [0, 10)" + kFashionHint);
    }
    data.labels[i] = labels.values[i];
  }
  return data;
}

Dataset make_synthetic(std::size_t size, bool train) {
  Dataset data;
  data.name = train ? "synthetic/train" : "synthetic/test";
  const int h = data.height, w = data.width;
  const std::size_t pixels = data.sample_floats();

  // Three soft blobs per class, so the classes overlap a little and a model
  // has to combine pixels rather than read one.
  std::vector<float> patterns(static_cast<std::size_t>(data.classes) * pixels, 0.0f);
  for (int c = 0; c < data.classes; ++c) {
    Random random(mix(0x5e7a7e11ULL, static_cast<std::uint64_t>(c)));
    float* pattern = &patterns[static_cast<std::size_t>(c) * pixels];
    for (int blob = 0; blob < 3; ++blob) {
      const float cy = 5.0f + 18.0f * random.uniform();
      const float cx = 5.0f + 18.0f * random.uniform();
      const float radius = 2.0f + 3.0f * random.uniform();
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          const float d2 = (y - cy) * (y - cy) + (x - cx) * (x - cx);
          pattern[y * w + x] += std::exp(-d2 / (2.0f * radius * radius));
        }
      }
    }
  }

  data.images.resize(size * pixels);
  data.labels.resize(size);
  const std::uint64_t split_seed = train ? 0x7a1ULL : 0x7e57ULL;
  for (std::size_t i = 0; i < size; ++i) {
    Random random(mix(split_seed, i));
    const int label = static_cast<int>(random.below(data.classes));
    const float brightness = 0.6f + 0.4f * random.uniform();
    // A shift of up to one pixel each way, so position alone does not decide.
    const int dy = static_cast<int>(random.below(3)) - 1;
    const int dx = static_cast<int>(random.below(3)) - 1;
    const float* pattern = &patterns[static_cast<std::size_t>(label) * pixels];
    float* out = &data.images[i * pixels];
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const int sy = std::clamp(y + dy, 0, h - 1);
        const int sx = std::clamp(x + dx, 0, w - 1);
        const float noise = 2.0f * (random.uniform() - 0.5f);
        out[y * w + x] = std::clamp(brightness * pattern[sy * w + sx] + noise, 0.0f, 1.0f);
      }
    }
    data.labels[i] = label;
  }
  return data;
}

Dataset make_synthetic_ids(std::size_t size, bool train) {
  Dataset data;
  data.name = train ? "synthetic-ids/train" : "synthetic-ids/test";
  data.channels = 0;
  data.classes = 2;
  data.ids_per_sample = kSyntheticIdFields;
  data.ids.reserve(size * kSyntheticIdFields);
  data.labels.resize(size);
  const std::uint64_t split_seed = train ? 0x1d5a1ULL : 0x1d5e7ULL;
  for (std::size_t i = 0; i < size; ++i) {
    Random random(mix(split_seed, i));
    int positive = 0;
    for (std::size_t f = 0; f < kSyntheticIdFields; ++f) {
      const std::uint64_t id = f * kSyntheticIdVocab + random.below(kSyntheticIdVocab);
      data.ids.push_back(id);
      positive += mix(0x5167ULL, id) % 2 == 1;
    }
    data.labels[i] = 2 * positive > static_cast<int>(kSyntheticIdFields) ? 1 : 0;
  }
  return data;
}

namespace {

Dataset load_criteo(const DataConfig& config, bool train, std::uint32_t worker,
                    std::uint32_t workers) {
  const CriteoOptions options{.block_lines = config.block_lines,
                              .test_fraction = config.test_fraction,
                              .test_split = !train,
                              .skip_bad_lines = config.skip_bad_lines,
                              .log_integers = config.log_integers};
  // With a test fraction both splits come from the training file.
  const bool from_train = train || config.test_fraction > 0;
  const auto& path = from_train ? config.train : config.test;
  if (path.empty())
    throw DataError(std::string("data: criteo needs data.") + (from_train ? "train" : "test") +
                    ", the file of its " + (train ? "training" : "test") + " split (docs/ctr.md)");
  return read_criteo(path, options, worker, workers);
}

}  // namespace

Dataset load_dataset(const DataConfig& config, bool train, std::uint32_t worker,
                     std::uint32_t workers) {
  if (config.name == "fashion-mnist") return load_fashion_mnist(config.dir, train);
  if (config.name == "criteo") return load_criteo(config, train, worker, workers);
  const auto size = train ? config.synthetic_train : config.synthetic_test;
  if (config.name == "synthetic") return make_synthetic(size, train);
  if (config.name == "synthetic-ids") return make_synthetic_ids(size, train);
  if (config.name == "synthetic-ctr") return make_synthetic_ctr(config, train, 0, size);
  throw std::invalid_argument("data.name: unknown dataset '" + config.name +
                              "' (expected fashion-mnist, synthetic, synthetic-ids, criteo or "
                              "synthetic-ctr)");
}

DataShape data_shape(const DataConfig& config) {
  if (config.name == "synthetic-ids") return {0, 1, 1, 2, kSyntheticIdFields};
  if (config.name == "criteo" || config.name == "synthetic-ctr")
    return {kCtrDenseFeatures, 1, 1, 2, static_cast<std::size_t>(kCtrFields)};
  return {};
}

WorkerShard::WorkerShard(const Dataset& data, std::uint32_t worker, std::uint32_t workers,
                         std::uint64_t seed)
    : data_(data), worker_(worker), seed_(seed) {
  if (workers == 0 || worker >= workers) {
    throw std::invalid_argument("data: worker " + std::to_string(worker) + " is not one of " +
                                std::to_string(workers) + " workers");
  }
  if (data.part_size > 0) {
    // The loader read only this worker's samples.
    if (data.part_size > data.size())
      throw std::invalid_argument("data: " + data.name + " has " + std::to_string(data.size()) +
                                  " samples, fewer than its part_size " +
                                  std::to_string(data.part_size));
    part_ = data.part_size;
    first_ = 0;
  } else {
    part_ = data.size() / workers;
    if (part_ == 0) {
      throw std::invalid_argument("data: " + data.name + " has " + std::to_string(data.size()) +
                                  " samples, too few for " + std::to_string(workers) + " workers");
    }
    first_ = part_ * worker;
  }
  order_ = epoch_order(0);
}

std::vector<std::size_t> WorkerShard::epoch_order(std::uint64_t epoch) const {
  std::vector<std::size_t> order(part_);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = first_ + i;
  Random random(mix(mix(seed_, worker_), epoch));
  for (std::size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[random.below(i)]);
  }
  return order;
}

Batch WorkerShard::next_batch(std::size_t batch_size, float* images, std::int32_t* labels,
                              std::uint64_t* ids) {
  if (batch_size == 0) throw std::invalid_argument("data: batch size must be > 0");
  if (position_ == order_.size()) {
    order_ = epoch_order(++epoch_);
    position_ = 0;
    batch_index_ = 0;
  }
  Batch batch{std::min(batch_size, order_.size() - position_), epoch_, batch_index_++};
  const std::size_t floats = data_.sample_floats();
  for (std::size_t i = 0; i < batch.size; ++i) {
    const std::size_t sample = order_[position_ + i];
    std::copy_n(data_.image(sample), floats, images + i * floats);
    labels[i] = data_.labels[sample];
    if (ids)
      std::copy_n(data_.sample_ids(sample), data_.ids_per_sample, ids + i * data_.ids_per_sample);
  }
  position_ += batch.size;
  return batch;
}

std::size_t WorkerShard::peek_ids(std::size_t batch_size, std::vector<std::uint64_t>& ids) const {
  if (batch_size == 0) throw std::invalid_argument("data: batch size must be > 0");
  // At the end of an epoch, next_batch starts the next one's order.
  std::vector<std::size_t> next_order;
  const bool new_epoch = position_ == order_.size();
  if (new_epoch) next_order = epoch_order(epoch_ + 1);
  const auto& order = new_epoch ? next_order : order_;
  const std::size_t from = new_epoch ? 0 : position_;
  const std::size_t n = std::min(batch_size, order.size() - from);
  const std::size_t k = data_.ids_per_sample;
  ids.resize(n * k);
  for (std::size_t i = 0; i < n; ++i)
    std::copy_n(data_.sample_ids(order[from + i]), k, ids.data() + i * k);
  return n;
}

void WorkerShard::seek(std::uint64_t batches, std::size_t batch_size) {
  if (batch_size == 0) throw std::invalid_argument("data: batch size must be > 0");
  // Every epoch has the same number of batches (the last one possibly
  // smaller), so the epoch and the batch within it follow from the count.
  // A count that ends an epoch lands at the start of the next one, which
  // next_batch reads the same as the end of the previous.
  const std::uint64_t per_epoch = batches_per_epoch(batch_size);
  const std::uint64_t epoch = batches / per_epoch;
  if (epoch != epoch_) order_ = epoch_order(epoch);
  epoch_ = epoch;
  batch_index_ = static_cast<std::size_t>(batches % per_epoch);
  position_ = batch_index_ * batch_size;
}

}  // namespace pstrain
