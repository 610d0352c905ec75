#pragma once
// synthetic-ctr (docs/ctr.md): click data of Criteo's shape and rough
// statistics, with labels from a planted teacher, so that a run knows the
// best AUC and log loss any model could reach (Dataset::ceiling_*).
//
// Sample i of a split is a pure function of (data.synthetic_ctr, split, i):
// - 13 integers I1..I13, each missing with a fixed per-feature chance (about
//   19% of all) or a log-normal count floor(exp(mu + sigma z)) with Criteo-like
//   per-feature mu and sigma (I2 is sometimes -1..-3, as Criteo's is); the
//   dense features are made from them exactly as the criteo reader does
//   (ctr_dense);
// - 26 categorical fields, field f's value a Zipf(zipf_s) rank in
//   1..vocab(f) (Criteo's C1..C26 vocabulary sizes x vocab_scale, at least 1),
//   its id ctr_id(f, rank - 1) as the criteo reader would hash it;
// - the label drawn Bernoulli(sigmoid(teacher logit)).
//
// The teacher (CtrTeacher): logit = bias + sum_f w(f, id_f)
//   + sum_{f<g} <u(f, id_f), u(g, id_g)> + sum_j a_j (log1p(I_j) - c_j) / s_j,
// w and u (4 factors) pseudo-normal functions of (seed, field, id), the bias
// calibrated so that the mean click probability over a fixed sample is
// click_rate. At the default settings its AUC is about 0.80 (Criteo's best
// models: about 0.80 to 0.81).
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <utility>

#include "client/data/criteo_reader.h"
#include "client/data/dataset.h"
#include "shared/config.h"

namespace pstrain {

// Criteo's (Kaggle Display Advertising) number of distinct values of
// C1..C26.
inline constexpr std::array<std::uint64_t, kCtrCategorical> kCriteoVocab = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};

// Field f's vocabulary: kCriteoVocab[f] x vocab_scale, rounded, at least 1.
std::uint64_t synthetic_ctr_vocab(const SyntheticCtrConfig& config, std::size_t field);

// Draws ranks 1..n with P(k) proportional to k^-s (s > 0) in O(1) expected
// time whatever n: rejection-inversion (Hörmann and Derflinger, "Rejection-
// inversion to generate variates from monotone discrete distributions",
// 1996), as Apache Commons RNG implements it.
class ZipfSampler {
 public:
  // Throws std::invalid_argument when n is 0 or s <= 0.
  ZipfSampler(std::uint64_t n, double s);
  // `uniform()` returns doubles in [0, 1).
  template <class Uniform>
  std::uint64_t operator()(Uniform&& uniform) const {
    for (;;) {
      const double u = h_n_ + uniform() * (h_x1_ - h_n_);
      const double x = h_integral_inverse(u);
      double k = std::floor(x + 0.5);
      k = k < 1 ? 1 : (k > n_ ? n_ : k);
      if (k - x <= threshold_ || u >= h_integral(k + 0.5) - h(k))
        return static_cast<std::uint64_t>(k);
    }
  }
  std::uint64_t n() const { return static_cast<std::uint64_t>(n_); }

 private:
  double h(double x) const;
  double h_integral(double x) const;
  double h_integral_inverse(double x) const;

  double n_, s_;
  double h_x1_ = 0, h_n_ = 0, threshold_ = 0;
};

// The planted teacher of a seed (see above).
class CtrTeacher {
 public:
  // Calibrates the bias (bisection on a fixed sample of the generator's
  // features; deterministic).
  explicit CtrTeacher(const SyntheticCtrConfig& config);
  // The logit of a sample from its 13 raw integers (kCtrMissingInteger:
  // missing) and 26 ids.
  double logit(const std::int32_t* raw_integers, const std::uint64_t* ids) const {
    return bias_ + unbiased_logit(raw_integers, ids);
  }
  double bias() const { return bias_; }

 private:
  double unbiased_logit(const std::int32_t* raw_integers, const std::uint64_t* ids) const;

  std::uint64_t seed_;
  std::array<double, kCtrCategorical> w_scale_;
  std::array<double, kCtrDense> dense_weight_;
  double bias_ = 0;
};

// Samples [first, first + count) of synthetic-ctr's training (`train`) or
// test split as data.synthetic_ctr and data.log_integers say: the same
// samples as that slice of the whole split. Fills raw_integers, and for the
// test split ceiling_auc and ceiling_logloss (the teacher's on these
// samples).
Dataset make_synthetic_ctr(const DataConfig& config, bool train, std::size_t first,
                           std::size_t count);

// Writes `data` (made by make_synthetic_ctr: it needs raw_integers) as a
// Criteo TSV file, gzip when the name ends in ".gz": the label, the 13 raw
// integers (missing ones empty) and the 26 ids as 16 hexadecimal digits. The
// criteo reader reads it back to the same labels and dense features, and ids
// ctr_id(f, id): one to one with the originals in each field. Throws
// std::invalid_argument for a dataset without raw integers, DataError when the
// file cannot be written.
void write_criteo_tsv(const Dataset& data, const std::filesystem::path& path);

// `pstrain --export-data DIR`: the configured synthetic-ctr's training and
// test splits as DIR/train.tsv and DIR/test.tsv, Criteo's format, for peers
// (bench/bench_torch_ctr.py) to train on the very same samples. Throws
// ConfigError for another data set. Returns the two paths.
std::pair<std::filesystem::path, std::filesystem::path> export_ctr_data(
    const DataConfig& config, const std::filesystem::path& dir);

}  // namespace pstrain
