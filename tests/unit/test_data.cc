// The IDX reader on the real Fashion-MNIST files and on damaged copies, the
// synthetic set, and the per-worker shards.
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "client/data/dataset.h"
#include "client/data/idx_reader.h"
#include "tests/support/child_process.h"

namespace fs = std::filesystem;
using namespace pstrain;

namespace {

const fs::path kFashion = "/usr/share/datasets/fashion-mnist";

void write_gz(const fs::path& path, const std::vector<unsigned char>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  if (!bytes.empty()) {
    REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) ==
            static_cast<int>(bytes.size()));
  }
  REQUIRE(gzclose(file) == Z_OK);
}

// An IDX header (unsigned bytes) followed by `values` bytes 0, 1, 2, ...
std::vector<unsigned char> idx_bytes(std::vector<std::uint32_t> dims, std::size_t values) {
  std::vector<unsigned char> bytes = {0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back((d >> shift) & 0xff);
  }
  for (std::size_t i = 0; i < values; ++i) bytes.push_back(static_cast<unsigned char>(i % 10));
  return bytes;
}

std::string read_error(const fs::path& path, int rank) {
  try {
    read_idx(path, rank);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

std::string fashion_error(const fs::path& dir, bool train = false) {
  try {
    load_fashion_mnist(dir, train);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("idx: the real Fashion-MNIST test split has its known shape and contents") {
  // Facts checked independently with Python's gzip module.
  const Dataset test = load_fashion_mnist(kFashion, false);
  CHECK(test.size() == 10000);
  CHECK(test.images.size() == 10000u * 784);
  CHECK(test.name == "fashion-mnist/test");
  CHECK(std::vector<int>(test.labels.begin(), test.labels.begin() + 10) ==
        std::vector<int>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  CHECK(test.labels.back() == 5);
  std::vector<int> counts(10, 0);
  for (int label : test.labels) {
    REQUIRE(label >= 0);
    REQUIRE(label < 10);
    ++counts[label];
  }
  CHECK(counts == std::vector<int>(10, 1000));
  CHECK(test.image(0)[14 * 28 + 14] == doctest::Approx(110.0 / 255.0));
  double sum0 = 0, sum_last = 0;
  for (int p = 0; p < 784; ++p) {
    sum0 += test.image(0)[p];
    sum_last += test.image(9999)[p];
  }
  CHECK(sum0 == doctest::Approx(33456.0 / 255.0));
  CHECK(sum_last == doctest::Approx(24390.0 / 255.0));
  CHECK(*std::min_element(test.images.begin(), test.images.end()) >= 0.0f);
  CHECK(*std::max_element(test.images.begin(), test.images.end()) <= 1.0f);
}

TEST_CASE("idx: the real training labels have their declared header") {
  const IdxArray labels = read_idx(kFashion / "train-labels-idx1-ubyte.gz", 1);
  CHECK(labels.dims == std::vector<std::uint32_t>{60000});
  CHECK(std::vector<int>(labels.values.begin(), labels.values.begin() + 10) ==
        std::vector<int>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  // An image file read as labels has the wrong magic number.
  CHECK(read_error(kFashion / "t10k-images-idx3-ubyte.gz", 1).find("bad magic number 0x00000803") !=
        std::string::npos);
}

TEST_CASE("idx: damaged files are reported with the file and the problem") {
  TempDir dir;
  const fs::path file = dir.path() / "damaged.gz";

  SUBCASE("bad magic") {
    auto bytes = idx_bytes({4}, 4);
    bytes[2] = 0x0d;  // float32 values: not what an image or label file holds
    write_gz(file, bytes);
    const std::string error = read_error(file, 1);
    CHECK(error.find(file.string()) != std::string::npos);
    CHECK(error.find("bad magic number 0x00000d01, expected 0x00000801") != std::string::npos);
  }
  SUBCASE("truncated values") {
    write_gz(file, idx_bytes({10, 2, 2}, 25));
    const std::string error = read_error(file, 3);
    CHECK(error.find(file.string() + ": truncated") != std::string::npos);
    CHECK(error.find("10x2x2 values needs 40 bytes, the file holds 25") != std::string::npos);
  }
  SUBCASE("truncated header") {
    write_gz(file, {0, 0, 8, 3, 0, 0});
    CHECK(read_error(file, 3).find("truncated: the dimensions") != std::string::npos);
  }
  SUBCASE("trailing bytes") {
    write_gz(file, idx_bytes({3}, 4));
    CHECK(read_error(file, 1).find("trailing bytes after the declared 3 values") !=
          std::string::npos);
  }
  SUBCASE("zero dimension") {
    write_gz(file, idx_bytes({0, 28, 28}, 0));
    CHECK(read_error(file, 3).find("dimension 0 is zero") != std::string::npos);
  }
  SUBCASE("cut-off gzip stream") {
    write_gz(file, idx_bytes({2000}, 2000));
    const auto size = fs::file_size(file);
    fs::resize_file(file, size / 2);
    const std::string error = read_error(file, 1);
    CHECK(error.find(file.string()) != std::string::npos);
    CHECK((error.find("truncated") != std::string::npos ||
           error.find("corrupt gzip") != std::string::npos));
  }
  SUBCASE("empty file") {
    write_gz(file, {});
    CHECK(read_error(file, 1).find("truncated: the magic number needs 4 bytes, the file holds 0") !=
          std::string::npos);
  }
}

TEST_CASE("fashion-mnist: a missing directory names the file and the package") {
  const fs::path dir = "/nonexistent/pstrain-data";
  CHECK(fashion_error(dir, true) ==
        "data: cannot open /nonexistent/pstrain-data/train-images-idx3-ubyte.gz "
        "(No such file or directory); install Debian's dataset-fashion-mnist "
        "package or set data.dir");
}

TEST_CASE("fashion-mnist: inconsistent files are rejected") {
  TempDir dir;
  const fs::path images = dir.path() / "t10k-images-idx3-ubyte.gz";
  const fs::path labels = dir.path() / "t10k-labels-idx1-ubyte.gz";
  SUBCASE("wrong image size") {
    write_gz(images, idx_bytes({2, 27, 27}, 2 * 27 * 27));
    write_gz(labels, idx_bytes({2}, 2));
    CHECK(fashion_error(dir.path()).find("images are 27x27, expected 28x28") != std::string::npos);
  }
  SUBCASE("counts differ") {
    write_gz(images, idx_bytes({3, 28, 28}, 3 * 784));
    write_gz(labels, idx_bytes({2}, 2));
    CHECK(fashion_error(dir.path()).find("holds 3 images but") != std::string::npos);
  }
  SUBCASE("label out of range") {
    write_gz(images, idx_bytes({1, 28, 28}, 784));
    auto bytes = idx_bytes({1}, 1);
    bytes.back() = 10;
    write_gz(labels, bytes);
    CHECK(fashion_error(dir.path()).find("label 10 of sample 0 is not a class") !=
          std::string::npos);
  }
  SUBCASE("valid tiny split loads") {
    write_gz(images, idx_bytes({2, 28, 28}, 2 * 784));
    write_gz(labels, idx_bytes({2}, 2));
    const Dataset data = load_fashion_mnist(dir.path(), false);
    CHECK(data.size() == 2);
    CHECK(data.labels == std::vector<std::int32_t>{0, 1});
    CHECK(data.image(0)[3] == doctest::Approx(3.0 / 255.0));
  }
}

TEST_CASE("synthetic: deterministic, in range, all classes, splits differ") {
  DataConfig config;
  config.name = "synthetic";
  config.synthetic_train = 500;
  config.synthetic_test = 200;
  const Dataset train = load_dataset(config, true);
  const Dataset again = load_dataset(config, true);
  const Dataset test = load_dataset(config, false);
  CHECK(train.size() == 500);
  CHECK(test.size() == 200);
  CHECK(train.images.size() == 500u * 784);
  CHECK(train.images == again.images);
  CHECK(train.labels == again.labels);
  CHECK(std::set<int>(train.labels.begin(), train.labels.end()).size() == 10);
  CHECK(!std::equal(test.images.begin(), test.images.end(), train.images.begin()));
  CHECK(*std::min_element(train.images.begin(), train.images.end()) >= 0.0f);
  CHECK(*std::max_element(train.images.begin(), train.images.end()) <= 1.0f);

  config.name = "cifar";
  CHECK_THROWS_WITH_AS(load_dataset(config, true),
                       "data.name: unknown dataset 'cifar' (expected fashion-mnist, synthetic, "
                       "synthetic-ids, criteo or synthetic-ctr)",
                       std::invalid_argument);
}

TEST_CASE("shards: equal disjoint parts, a new deterministic order every epoch") {
  const Dataset data = make_synthetic(103, true);
  const std::uint32_t workers = 3;
  std::set<std::size_t> seen;
  for (std::uint32_t w = 0; w < workers; ++w) {
    WorkerShard shard(data, w, workers, 7);
    CHECK(shard.size() == 34);  // 103 / 3; the last sample is unused
    const auto order0 = shard.epoch_order(0);
    const auto order1 = shard.epoch_order(1);
    CHECK(order0 != order1);
    CHECK(order0 == WorkerShard(data, w, workers, 7).epoch_order(0));
    CHECK(order0 != WorkerShard(data, w, workers, 8).epoch_order(0));
    auto sorted = order1;
    std::sort(sorted.begin(), sorted.end());
    auto sorted0 = order0;
    std::sort(sorted0.begin(), sorted0.end());
    CHECK(sorted == sorted0);
    for (std::size_t i : order0) {
      CHECK(i >= shard.first());
      CHECK(i < shard.first() + shard.size());
      CHECK(seen.insert(i).second);  // owned by no other worker
    }
  }
  CHECK(seen.size() == 102);
  CHECK(*seen.rbegin() == 101);

  CHECK_THROWS_AS(WorkerShard(data, 3, 3, 0), std::invalid_argument);
  CHECK_THROWS_AS(WorkerShard(make_synthetic(2, true), 0, 3, 0), std::invalid_argument);
}

TEST_CASE("shards: batches follow the epoch order, the last one is smaller") {
  const Dataset data = make_synthetic(20, true);
  WorkerShard shard(data, 1, 2, 3);  // samples 10..19
  CHECK(shard.batches_per_epoch(4) == 3);
  std::vector<float> images(4 * 784);
  std::vector<std::int32_t> labels(4);
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    const auto order = shard.epoch_order(epoch);
    std::size_t position = 0;
    for (std::size_t b = 0; b < 3; ++b) {
      const Batch batch = shard.next_batch(4, images.data(), labels.data());
      CHECK(batch.epoch == epoch);
      CHECK(batch.index == b);
      CHECK(batch.size == (b < 2 ? 4u : 2u));
      for (std::size_t i = 0; i < batch.size; ++i, ++position) {
        const std::size_t sample = order[position];
        CHECK(labels[i] == data.labels[sample]);
        CHECK(std::equal(data.image(sample), data.image(sample) + 784,
                         images.begin() + static_cast<std::ptrdiff_t>(i * 784)));
      }
    }
  }
}

TEST_CASE("shards: seek lands where reading that many batches one by one does") {
  const Dataset data = make_synthetic(20, true);
  std::vector<float> images(4 * 784), seek_images(4 * 784);
  std::vector<std::int32_t> labels(4), seek_labels(4);
  // 3 batches per epoch (4, 4, 2): counts inside an epoch, at its end and
  // two epochs on. The sought shard has read a batch first, so 0 and 1 seek
  // backwards and in place.
  for (const std::uint64_t target : {0u, 1u, 2u, 3u, 5u, 7u}) {
    WorkerShard read(data, 1, 2, 3), sought(data, 1, 2, 3);
    for (std::uint64_t b = 0; b < target; ++b) read.next_batch(4, images.data(), labels.data());
    sought.next_batch(4, seek_images.data(), seek_labels.data());  // not at the start any more
    sought.seek(target, 4);
    // The next four batches agree, across the next epoch boundary.
    for (int b = 0; b < 4; ++b) {
      const Batch expected = read.next_batch(4, images.data(), labels.data());
      const Batch got = sought.next_batch(4, seek_images.data(), seek_labels.data());
      CAPTURE(target);
      CAPTURE(b);
      CHECK(got.epoch == expected.epoch);
      CHECK(got.index == expected.index);
      REQUIRE(got.size == expected.size);
      CHECK(std::equal(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(got.size),
                       seek_labels.begin()));
      CHECK(std::equal(images.begin(), images.begin() + static_cast<std::ptrdiff_t>(got.size * 784),
                       seek_images.begin()));
    }
  }
  WorkerShard shard(data, 0, 2, 3);
  CHECK_THROWS_AS(shard.seek(1, 0), std::invalid_argument);
}
