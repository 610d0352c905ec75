#pragma once
// Click logs in Criteo's TSV format (docs/ctr.md): one impression per line,
// tab-separated,
//
//   label  I1 .. I13  C1 .. C26
//
// the label 0 or 1, I1..I13 integer counts (Criteo's may be negative), C1..C26
// categorical values as hexadecimal strings; any feature may be empty. The
// file is plain or gzip (zlib reads both), and is streamed through a fixed
// buffer, never held whole.
//
// As a Dataset: the 13 dense features as `images` (channels 13, 1x1), a
// missing integer as 0 and each log(1 + x) when log_integers; 26 ids per
// sample, field f's value v as ctr_id(f, v) (an empty field as
// ctr_missing_id(f)); 2 classes.
//
// Workers: the file's lines are cut into blocks of `block_lines`; block k
// belongs to worker k mod workers. Every worker scans every line boundary
// (memchr) but parses only its own blocks, so one large file needs no
// pre-split. With test_fraction f > 0 a block is a test block when
// ctr_block_hash(k) / 2^64 < f: the training split leaves the test blocks
// out and deals the remaining ones to the workers by their own count (the
// t-th training block to worker t mod workers); the test split is every
// test block.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "client/data/dataset.h"

namespace pstrain {

// Criteo's columns (the model presets' shape too, shared/config.h).
inline constexpr std::size_t kCtrDense = kCtrDenseFeatures;  // I1..I13
inline constexpr std::size_t kCtrCategorical = kCtrFields;   // C1..C26
inline constexpr std::size_t kCtrColumns = 1 + kCtrDense + kCtrCategorical;
// A missing integer in Dataset::raw_integers.
inline constexpr std::int32_t kCtrMissingInteger = INT32_MIN;

namespace ctr_detail {
// splitmix64's finalizer: a bijection of 64-bit values.
constexpr std::uint64_t fmix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
constexpr std::uint64_t field_key(std::size_t field) {
  return fmix(0x63726974656f0000ULL + field * 0x9e3779b97f4a7c15ULL);
}
}  // namespace ctr_detail

// The id of value `value` (a categorical string read as a hexadecimal
// number, so "0a" and "a" are one value: Criteo's are all 8 digits) of
// categorical field `field` (0-based: C1 is 0). For each field a bijection
// of 64-bit values, so two values of a field never share an id; equal values
// of different fields get unrelated ids.
constexpr std::uint64_t ctr_id(std::size_t field, std::uint64_t value) {
  const std::uint64_t key = ctr_detail::field_key(field);
  return ctr_detail::fmix(ctr_detail::fmix(value ^ key) + key);
}

// The id of an empty categorical field: one per field.
constexpr std::uint64_t ctr_missing_id(std::size_t field) {
  return ctr_detail::fmix(ctr_detail::field_key(field) ^ 0x6d697373696e6721ULL);
}

// A dense feature from its integer: log(1 + max(x, 0)) when log_integers,
// else x.
float ctr_dense(std::int64_t value, bool log_integers);

// Where block `block` falls: a test block when the result / 2^64 is below
// data.test_fraction.
constexpr std::uint64_t ctr_block_hash(std::uint64_t block) {
  return ctr_detail::fmix(ctr_detail::fmix(block + 0x626c6f636bULL) ^ 0x7465737473706c74ULL);
}
bool ctr_test_block(std::uint64_t block, double test_fraction);

// An empty data set of Criteo's shape, named `name`: 13 dense features as
// the sample's floats, 26 ids per sample, 2 classes.
Dataset ctr_dataset(std::string name);

struct CriteoOptions {
  std::uint32_t block_lines = 4096;
  double test_fraction = 0;  // > 0: the file holds both splits (see above)
  bool test_split = false;   // read the test split (every test block; worker is ignored)
  bool skip_bad_lines = false;
  bool log_integers = true;
};

// Reads worker `worker` of `workers`'s part of a Criteo file: with
// test_fraction 0 and !test_split, the lines of blocks k with
// k mod workers == worker; with test_fraction > 0, the training or the test
// split's blocks as said above; with test_split and test_fraction 0, every
// line (a test file). Samples keep the file's order.
//
// Training parts (!test_split): part_size is the fewest lines any worker's
// blocks hold (one worker: its samples), so that every worker trains on as
// many; a worker left with fewer samples by skipped lines repeats its own
// from the first to make up part_size (logged). The test split has
// part_size 0 (the whole set).
//
// Throws DataError naming the file, and for a malformed line its 1-based
// number, the field (label, I1..I13, C1..C26) and what is wrong; with
// skip_bad_lines such lines are skipped and counted in skipped_lines
// (only the worker's own, which it parses). A missing file, or a part with no
// samples, is a DataError too.
Dataset read_criteo(const std::filesystem::path& path, const CriteoOptions& options,
                    std::uint32_t worker = 0, std::uint32_t workers = 1);

}  // namespace pstrain
