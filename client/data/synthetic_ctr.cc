#include "client/data/synthetic_ctr.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "client/data/click_metrics.h"

namespace pstrain {

namespace {

using ctr_detail::fmix;

std::uint64_t hash3(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return fmix(fmix(fmix(a ^ 0x5eedc7a11ab1e5ULL) ^ b) + c);
}

// An approximately standard normal value from 64 random bits: the sum of
// four 16-bit uniforms, centred and scaled (Irwin-Hall; |z| < 2 sqrt(3)).
// Arithmetic only, so the same on every platform.
double approx_normal(std::uint64_t bits) {
  double sum = 0;
  for (int i = 0; i < 4; ++i) sum += static_cast<double>((bits >> (16 * i)) & 0xffff) + 0.5;
  return (sum * 0x1.0p-16 - 2.0) * 1.7320508075688772;
}

double unit(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// splitmix64: one stream per sample.
class Stream {
 public:
  explicit Stream(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return fmix(state_ += 0x9e3779b97f4a7c15ULL); }
  double uniform() { return unit(next()); }
  double normal() { return approx_normal(next()); }

 private:
  std::uint64_t state_;
};

// I1..I13: log(count) ~ N(mu, sigma), missing with probability `missing`;
// `negative`: the chance of a count of -1, -2 or -3 instead (Criteo's I2).
struct DenseStat {
  double mu, sigma, missing, negative;
};
constexpr std::array<DenseStat, kCtrDense> kDenseStats = {{
    {0.7, 1.2, 0.40, 0},     // I1: small counts, often missing
    {1.5, 1.8, 0.00, 0.08},  // I2: never missing, sometimes negative
    {2.0, 1.3, 0.20, 0},     // I3
    {1.6, 1.0, 0.20, 0},     // I4
    {7.5, 2.2, 0.03, 0},     // I5: large counts (Criteo's reach 10^7)
    {3.5, 1.6, 0.20, 0},     // I6
    {1.5, 1.4, 0.04, 0},     // I7
    {2.0, 1.0, 0.00, 0},     // I8
    {3.6, 1.4, 0.04, 0},     // I9
    {0.2, 0.6, 0.40, 0},     // I10: mostly 0 and 1
    {0.9, 1.0, 0.04, 0},     // I11
    {0.2, 0.8, 0.50, 0},     // I12
    {1.6, 1.1, 0.20, 0},     // I13
}};

constexpr std::uint64_t kTrainSplit = 0x747261696eULL, kTestSplit = 0x74657374ULL,
                        kCalibrationSplit = 0x63616c6962ULL;
constexpr std::uint64_t kWeightTag = 0x77ULL, kScaleTag = 0x73ULL, kDenseTag = 0x64ULL;

// The teacher's scales, chosen so that its AUC is about 0.8 at the defaults
// (tests/unit/test_synthetic_ctr.cc checks the range).
constexpr double kWeightScale = 0.21;   // root mean square of the fields' w scales
constexpr double kFactorScale = 0.142;  // of each of u's factors
constexpr double kDenseScale = 0.155;   // root mean square of the dense coefficients
constexpr std::size_t kFactors = 4;
constexpr std::size_t kCalibrationSamples = 32768;

// The features of the generator's samples.
class Generator {
 public:
  explicit Generator(const SyntheticCtrConfig& config) : seed_(config.seed) {
    samplers_.reserve(kCtrCategorical);
    for (std::size_t f = 0; f < kCtrCategorical; ++f)
      samplers_.emplace_back(synthetic_ctr_vocab(config, f), config.zipf_s);
  }

  // Sample `index` of `split`'s features; returns its stream, positioned for
  // the label's draw.
  Stream features(std::uint64_t split, std::uint64_t index, std::int32_t* raw,
                  std::uint64_t* ids) const {
    Stream random(hash3(seed_, split, index));
    for (std::size_t j = 0; j < kCtrDense; ++j) {
      const DenseStat& stat = kDenseStats[j];
      const double u = random.uniform();
      const double z = random.normal();
      if (u < stat.missing) {
        raw[j] = kCtrMissingInteger;
      } else if (u < stat.missing + stat.negative) {
        raw[j] = -1 - static_cast<std::int32_t>(random.next() % 3);
      } else {
        const double count = std::floor(std::exp(stat.mu + stat.sigma * z));
        raw[j] = static_cast<std::int32_t>(std::min(count, 2147483647.0));
      }
    }
    const auto uniform = [&random] { return random.uniform(); };
    for (std::size_t f = 0; f < kCtrCategorical; ++f) ids[f] = ctr_id(f, samplers_[f](uniform) - 1);
    return random;
  }

 private:
  std::uint64_t seed_;
  std::vector<ZipfSampler> samplers_;
};

double sigmoid(double z) { return 1 / (1 + std::exp(-z)); }

// body(from, to) over [0, count), cut into one range per core for large
// counts (each sample is its own, so the order does not matter).
template <class Body>
void parallel_for(std::size_t count, const Body& body) {
  constexpr std::size_t kSlice = 1 << 15;
  const std::size_t threads = std::min<std::size_t>(
      (count + kSlice - 1) / kSlice, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) return body(std::size_t{0}, count);
  std::vector<std::jthread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back(body, count * t / threads, count * (t + 1) / threads);
}

float dense_value(std::int32_t raw, bool log_integers) {
  return raw == kCtrMissingInteger ? 0.0f : ctr_dense(raw, log_integers);
}

}  // namespace

std::uint64_t synthetic_ctr_vocab(const SyntheticCtrConfig& config, std::size_t field) {
  const double scaled =
      std::round(static_cast<double>(kCriteoVocab.at(field)) * config.vocab_scale);
  // Beyond 2^53 a double no longer holds every rank.
  return static_cast<std::uint64_t>(std::clamp(scaled, 1.0, 0x1.0p53));
}

// ---- ZipfSampler: Apache Commons RNG's RejectionInversionZipfSampler.

namespace {
// log(1 + x) / x, and its limit 1 at 0.
double helper1(double x) {
  return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
// (exp(x) - 1) / x, and its limit 1 at 0.
double helper2(double x) {
  return std::fabs(x) > 1e-8 ? std::expm1(x) / x
                             : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}
}  // namespace

ZipfSampler::ZipfSampler(std::uint64_t n, double s) : n_(static_cast<double>(n)), s_(s) {
  if (n == 0) throw std::invalid_argument("zipf: n must be >= 1");
  if (!(s > 0)) throw std::invalid_argument("zipf: the exponent must be > 0");
  h_x1_ = h_integral(1.5) - 1;
  h_n_ = h_integral(n_ + 0.5);
  threshold_ = 2 - h_integral_inverse(h_integral(2.5) - h(2));
}

// h(x) = x^-s, the density the ranks follow.
double ZipfSampler::h(double x) const { return std::exp(-s_ * std::log(x)); }

// H(x) = (x^(1-s) - 1) / (1 - s) (log x at s = 1): an integral of h.
double ZipfSampler::h_integral(double x) const {
  const double log_x = std::log(x);
  return helper2((1 - s_) * log_x) * log_x;
}

double ZipfSampler::h_integral_inverse(double x) const {
  double t = x * (1 - s_);
  if (t < -1) t = -1;  // rounding can take it just below
  return std::exp(helper1(t) * x);
}

// ---- The teacher.

CtrTeacher::CtrTeacher(const SyntheticCtrConfig& config) : seed_(config.seed) {
  // Fields of unequal weight, and dense coefficients of random signs and
  // sizes, each set scaled to a fixed root mean square so that the
  // teacher's strength varies little between seeds.
  double squares = 0;
  for (std::size_t f = 0; f < kCtrCategorical; ++f) {
    w_scale_[f] = 0.25 + 1.5 * unit(hash3(seed_, kScaleTag, f));
    squares += w_scale_[f] * w_scale_[f];
  }
  for (double& scale : w_scale_) scale *= kWeightScale / std::sqrt(squares / kCtrCategorical);
  squares = 0;
  for (std::size_t j = 0; j < kCtrDense; ++j) {
    dense_weight_[j] = approx_normal(hash3(seed_, kDenseTag, j));
    squares += dense_weight_[j] * dense_weight_[j];
  }
  for (double& weight : dense_weight_) weight *= kDenseScale / std::sqrt(squares / kCtrDense);

  // The bias that makes the mean click probability of a fixed sample
  // click_rate: the mean is increasing in it, so bisection finds it.
  const Generator generator(config);
  std::vector<double> logits(kCalibrationSamples);
  parallel_for(logits.size(), [&](std::size_t from, std::size_t to) {
    std::int32_t raw[kCtrDense];
    std::uint64_t ids[kCtrCategorical];
    for (std::size_t i = from; i < to; ++i) {
      generator.features(kCalibrationSplit, i, raw, ids);
      logits[i] = unbiased_logit(raw, ids);
    }
  });
  double lo = -40, hi = 40;
  for (int step = 0; step < 50; ++step) {
    const double mid = (lo + hi) / 2;
    double sum = 0;
    for (double z : logits) sum += sigmoid(mid + z);
    (sum / static_cast<double>(logits.size()) < config.click_rate ? lo : hi) = mid;
  }
  bias_ = (lo + hi) / 2;
}

double CtrTeacher::unbiased_logit(const std::int32_t* raw, const std::uint64_t* ids) const {
  double logit = 0;
  // Pairwise dot products of the factors: (|sum u|^2 - sum |u|^2) / 2.
  double factor_sum[kFactors] = {};
  double squares = 0;
  for (std::size_t f = 0; f < kCtrCategorical; ++f) {
    // w(f, id), then u(f, id)'s factors, from one hash of (seed, f, id).
    std::uint64_t bits = hash3(seed_ ^ kWeightTag, f, ids[f]);
    logit += w_scale_[f] * approx_normal(bits);
    for (std::size_t c = 0; c < kFactors; ++c) {
      bits = fmix(bits + 0x9e3779b97f4a7c15ULL);
      const double u = kFactorScale * approx_normal(bits);
      factor_sum[c] += u;
      squares += u * u;
    }
  }
  double pairs = -squares;
  for (double s : factor_sum) pairs += s * s;
  logit += pairs / 2;
  for (std::size_t j = 0; j < kCtrDense; ++j) {
    const DenseStat& stat = kDenseStats[j];
    const double x = dense_value(raw[j], true);
    logit += dense_weight_[j] * (x - stat.mu) / stat.sigma;
  }
  return logit;
}

// ---- The data set.

Dataset make_synthetic_ctr(const DataConfig& config, bool train, std::size_t first,
                           std::size_t count) {
  Dataset data = ctr_dataset(train ? "synthetic-ctr/train" : "synthetic-ctr/test");
  data.labels.resize(count);
  data.images.resize(count * kCtrDense);
  data.ids.resize(count * kCtrCategorical);
  data.raw_integers.resize(count * kCtrDense);

  const CtrTeacher teacher(config.synthetic_ctr);
  const Generator generator(config.synthetic_ctr);
  std::vector<float> logits(train ? 0 : count);
  const auto generate = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
      std::int32_t* raw = data.raw_integers.data() + i * kCtrDense;
      std::uint64_t* ids = data.ids.data() + i * kCtrCategorical;
      Stream random = generator.features(train ? kTrainSplit : kTestSplit, first + i, raw, ids);
      const double logit = teacher.logit(raw, ids);
      data.labels[i] = random.uniform() < sigmoid(logit) ? 1 : 0;
      for (std::size_t j = 0; j < kCtrDense; ++j)
        data.images[i * kCtrDense + j] = dense_value(raw[j], config.log_integers);
      if (!train) logits[i] = static_cast<float>(logit);
    }
  };
  parallel_for(count, generate);
  if (!train && count > 0) {
    data.ceiling_auc = exact_auc(logits, data.labels);
    data.ceiling_logloss = mean_logloss(logits, data.labels);
  }
  return data;
}

void write_criteo_tsv(const Dataset& data, const std::filesystem::path& path) {
  if (data.ids_per_sample != kCtrCategorical ||
      data.raw_integers.size() != data.size() * kCtrDense ||
      data.ids.size() != data.size() * kCtrCategorical)
    throw std::invalid_argument("write_criteo_tsv: " + data.name +
                                " is not a synthetic-ctr dataset with its raw integers");
  const std::string name = path.string();
  const bool gzip = name.size() >= 3 && name.compare(name.size() - 3, 3, ".gz") == 0;
  const auto failed = [&](const std::string& what) {
    return DataError("data: " + name + ": cannot write (" + what + ")");
  };
  gzFile gz = nullptr;
  std::FILE* plain = nullptr;
  if (gzip) {
    gz = gzopen(path.c_str(), "wb");
    if (gz == nullptr) throw failed(std::generic_category().message(errno));
  } else {
    plain = std::fopen(path.c_str(), "wb");
    if (plain == nullptr) throw failed(std::generic_category().message(errno));
  }
  const auto close = [&]() -> bool {
    const bool ok = gzip ? gzclose(gz) == Z_OK : std::fclose(plain) == 0;
    gz = nullptr;
    plain = nullptr;
    return ok;
  };
  std::string out;
  const auto flush = [&] {
    const bool ok =
        gzip ? out.empty() || gzwrite(gz, out.data(), static_cast<unsigned>(out.size())) ==
                                  static_cast<int>(out.size())
             : std::fwrite(out.data(), 1, out.size(), plain) == out.size();
    if (!ok) {
      const std::string why = std::generic_category().message(errno);
      close();
      throw failed(why);
    }
    out.clear();
  };
  constexpr std::size_t kFlushBytes = 1 << 20;
  out.reserve(kFlushBytes + 1024);
  char number[24];
  for (std::size_t i = 0; i < data.size(); ++i) {
    out += data.labels[i] != 0 ? '1' : '0';
    for (std::size_t j = 0; j < kCtrDense; ++j) {
      out += '\t';
      const std::int32_t raw = data.raw_integers[i * kCtrDense + j];
      if (raw == kCtrMissingInteger) continue;
      const auto [end, ec] = std::to_chars(number, number + sizeof number, raw);
      out.append(number, end);
    }
    for (std::size_t f = 0; f < kCtrCategorical; ++f) {
      const std::uint64_t id = data.ids[i * kCtrCategorical + f];
      out += '\t';
      for (int shift = 60; shift >= 0; shift -= 4) out += "0123456789abcdef"[(id >> shift) & 0xf];
    }
    out += '\n';
    if (out.size() >= kFlushBytes) flush();
  }
  flush();
  if (!close()) throw failed(std::generic_category().message(errno));
}

std::pair<std::filesystem::path, std::filesystem::path> export_ctr_data(
    const DataConfig& config, const std::filesystem::path& dir) {
  if (config.name != "synthetic-ctr")
    throw ConfigError("--export-data writes synthetic-ctr's samples; data.name is " + config.name);
  std::filesystem::create_directories(dir);
  const auto train = dir / "train.tsv", test = dir / "test.tsv";
  write_criteo_tsv(load_dataset(config, true), train);
  write_criteo_tsv(load_dataset(config, false), test);
  return {train, test};
}

}  // namespace pstrain
