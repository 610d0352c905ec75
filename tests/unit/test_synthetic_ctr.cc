// synthetic-ctr: a pure function of (config, split, index), Criteo's shape,
// the click rate it is calibrated to, Zipf-distributed values, the planted
// teacher's AUC, and the Criteo TSV it writes and the reader reads back.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client/data/click_metrics.h"
#include "client/data/criteo_reader.h"
#include "client/data/dataset.h"
#include "client/data/synthetic_ctr.h"
#include "tests/support/child_process.h"

namespace fs = std::filesystem;
using namespace pstrain;

namespace {

DataConfig ctr_config() {
  DataConfig config;
  config.name = "synthetic-ctr";
  return config;
}

// The 100,000-sample test split of the defaults, made once.
const Dataset& default_test() {
  static const Dataset data = make_synthetic_ctr(ctr_config(), false, 0, 100000);
  return data;
}

double click_rate(const Dataset& data) {
  double clicks = 0;
  for (auto label : data.labels) clicks += label;
  return clicks / static_cast<double>(data.size());
}

// sum_{k=1}^{n} k^-s: the first terms exactly, the rest as the integral of
// x^-s over [m + 0.5, n + 0.5] (the midpoint rule; its error is far below
// what the tests resolve).
double zipf_norm(double n, double s) {
  const double m = std::min(n, 10000.0);
  double sum = 0;
  for (double k = 1; k <= m; ++k) sum += std::pow(k, -s);
  if (n > m) {
    const auto integral = [s](double x) {
      return s == 1 ? std::log(x) : std::pow(x, 1 - s) / (1 - s);
    };
    sum += integral(n + 0.5) - integral(m + 0.5);
  }
  return sum;
}

std::uint64_t next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

TEST_CASE("synthetic-ctr: Criteo's shape; any slice equals that slice of the whole") {
  const DataConfig config = ctr_config();
  // Long enough to be made by several threads.
  const Dataset whole = make_synthetic_ctr(config, true, 0, 70000);
  CHECK(whole.name == "synthetic-ctr/train");
  CHECK(whole.size() == 70000);
  CHECK(whole.channels == 13);
  CHECK(whole.height == 1);
  CHECK(whole.width == 1);
  CHECK(whole.classes == 2);
  CHECK(whole.ids_per_sample == 26);
  CHECK(whole.images.size() == 70000u * 13);
  CHECK(whole.ids.size() == 70000u * 26);
  CHECK(whole.raw_integers.size() == 70000u * 13);
  CHECK(whole.part_size == 0);
  CHECK(whole.ceiling_auc == -1);  // only the test split has its ceiling

  for (const auto& [first, count] : std::vector<std::pair<std::size_t, std::size_t>>{
           {0, 10}, {31000, 39000}, {69999, 1}, {12345, 3}}) {
    CAPTURE(first);
    const Dataset slice = make_synthetic_ctr(config, true, first, count);
    REQUIRE(slice.size() == count);
    CHECK(std::equal(slice.labels.begin(), slice.labels.end(), whole.labels.begin() + first));
    CHECK(std::equal(slice.images.begin(), slice.images.end(), whole.images.begin() + first * 13));
    CHECK(std::equal(slice.ids.begin(), slice.ids.end(), whole.ids.begin() + first * 26));
    CHECK(std::equal(slice.raw_integers.begin(), slice.raw_integers.end(),
                     whole.raw_integers.begin() + first * 13));
  }

  // load_dataset makes the whole split, its size data.synthetic_train.
  DataConfig sized = config;
  sized.synthetic_train = 2000;
  const Dataset loaded = load_dataset(sized, true, 1, 2);
  CHECK(loaded.size() == 2000);
  CHECK(loaded.part_size == 0);
  CHECK(std::equal(loaded.ids.begin(), loaded.ids.end(), whole.ids.begin()));
  CHECK(std::equal(loaded.labels.begin(), loaded.labels.end(), whole.labels.begin()));

  // The test split, and another seed, are other samples.
  const Dataset test = make_synthetic_ctr(config, false, 0, 2000);
  CHECK(test.name == "synthetic-ctr/test");
  CHECK(!std::equal(test.ids.begin(), test.ids.end(), whole.ids.begin()));
  DataConfig reseeded = config;
  reseeded.synthetic_ctr.seed = 2;
  const Dataset other = make_synthetic_ctr(reseeded, true, 0, 2000);
  CHECK(!std::equal(other.ids.begin(), other.ids.end(), whole.ids.begin()));
  CHECK(!std::equal(other.labels.begin(), other.labels.end(), whole.labels.begin()));
}

TEST_CASE("synthetic-ctr: dense features are the criteo reader's, from Criteo-like counts") {
  DataConfig config = ctr_config();
  const Dataset data = make_synthetic_ctr(config, true, 0, 20000);
  std::size_t missing = 0, negative = 0, large = 0, wrong = 0;
  for (std::size_t i = 0; i < data.images.size(); ++i) {
    const std::int32_t raw = data.raw_integers[i];
    missing += raw == kCtrMissingInteger;
    negative += raw < 0 && raw != kCtrMissingInteger;
    large += raw > 10000;
    wrong += data.images[i] != (raw == kCtrMissingInteger ? 0.0f : ctr_dense(raw, true));
  }
  CHECK(wrong == 0);
  const double missing_share =
      static_cast<double>(missing) / static_cast<double>(data.images.size());
  CHECK(missing_share > 0.10);
  CHECK(missing_share < 0.25);
  CHECK(negative > 0);  // I2, as in Criteo
  CHECK(large > 0);     // I5's counts reach far

  // Raw integers for the features; the same samples and labels.
  config.log_integers = false;
  const Dataset raw = make_synthetic_ctr(config, true, 0, 20000);
  CHECK(raw.labels == data.labels);
  CHECK(raw.ids == data.ids);
  CHECK(raw.raw_integers == data.raw_integers);
  for (std::size_t i = 0; i < raw.images.size(); ++i) {
    const std::int32_t v = raw.raw_integers[i];
    if (raw.images[i] != (v == kCtrMissingInteger ? 0.0f : static_cast<float>(v))) {
      FAIL_CHECK("feature " << i << " is " << raw.images[i] << ", its integer " << v);
      break;
    }
  }
}

TEST_CASE("synthetic-ctr: the click rate is the configured one") {
  CHECK(click_rate(default_test()) == doctest::Approx(0.25).epsilon(0.04));  // +-0.01
  DataConfig config = ctr_config();
  config.synthetic_ctr.click_rate = 0.05;
  CHECK(click_rate(make_synthetic_ctr(config, true, 0, 40000)) ==
        doctest::Approx(0.05).epsilon(0.1));  // +-0.005
  config.synthetic_ctr.click_rate = 0.7;
  CHECK(click_rate(make_synthetic_ctr(config, true, 0, 40000)) ==
        doctest::Approx(0.7).epsilon(0.015));
}

TEST_CASE("synthetic-ctr: the teacher's AUC is Criteo-like, and is exact_auc of its logits") {
  const Dataset& test = default_test();
  CHECK(test.ceiling_auc > 0.78);
  CHECK(test.ceiling_auc < 0.82);
  // Below the entropy of a 25% click rate (0.562): the teacher knows a lot.
  CHECK(test.ceiling_logloss > 0.40);
  CHECK(test.ceiling_logloss < 0.50);

  // The ceiling is the teacher's logit of each sample's own features.
  const CtrTeacher teacher(ctr_config().synthetic_ctr);
  std::vector<float> logits(test.size());
  for (std::size_t i = 0; i < test.size(); ++i)
    logits[i] = static_cast<float>(
        teacher.logit(test.raw_integers.data() + i * kCtrDense, test.sample_ids(i)));
  CHECK(test.ceiling_auc == exact_auc(logits, test.labels));
  CHECK(test.ceiling_logloss == mean_logloss(logits, test.labels));
  // ... and the labels follow it: the clicked samples' mean probability
  // is higher.
  double clicked = 0, not_clicked = 0;
  for (std::size_t i = 0; i < test.size(); ++i)
    (test.labels[i] != 0 ? clicked : not_clicked) += 1 / (1 + std::exp(-logits[i]));
  const double positives = click_rate(test) * static_cast<double>(test.size());
  CHECK(clicked / positives > not_clicked / (static_cast<double>(test.size()) - positives) + 0.1);
}

TEST_CASE("synthetic-ctr: each field's values follow Zipf's law, its ids its own") {
  const Dataset& test = default_test();
  const DataConfig config = ctr_config();
  std::vector<std::map<std::uint64_t, std::size_t>> counts(kCtrCategorical);
  for (std::size_t i = 0; i < test.size(); ++i)
    for (std::size_t f = 0; f < kCtrCategorical; ++f) ++counts[f][test.sample_ids(i)[f]];
  // No id in two fields; no field with more ids than its vocabulary.
  std::set<std::uint64_t> all;
  std::size_t distinct = 0;
  for (std::size_t f = 0; f < kCtrCategorical; ++f) {
    CHECK(counts[f].size() <= synthetic_ctr_vocab(config.synthetic_ctr, f));
    distinct += counts[f].size();
    for (const auto& [id, n] : counts[f]) all.insert(id);
  }
  CHECK(all.size() == distinct);
  CHECK(counts[8].size() == 3);  // C9: Criteo's 3 values

  // C3 (10^7 values): the most frequent id takes 1 / H(n, s) of the samples,
  // the next ones 2^-s and 3^-s as much.
  const double n = static_cast<double>(synthetic_ctr_vocab(config.synthetic_ctr, 2));
  CHECK(n == 10131227);
  std::vector<std::size_t> sorted;
  for (const auto& [id, count] : counts[2]) sorted.push_back(count);
  std::sort(sorted.rbegin(), sorted.rend());
  const double total = static_cast<double>(test.size());
  const double top = 1 / zipf_norm(n, 1.1);
  CHECK(static_cast<double>(sorted[0]) / total == doctest::Approx(top).epsilon(0.05));
  CHECK(static_cast<double>(sorted[1]) / total ==
        doctest::Approx(top * std::pow(2, -1.1)).epsilon(0.08));
  CHECK(static_cast<double>(sorted[2]) / total ==
        doctest::Approx(top * std::pow(3, -1.1)).epsilon(0.1));
  // The long tail: most of the field's ids are seen once.
  CHECK(counts[2].size() > 20000);

  // vocab_scale shrinks (or grows) every vocabulary, to at least one value.
  SyntheticCtrConfig small = config.synthetic_ctr;
  small.vocab_scale = 0.001;
  CHECK(synthetic_ctr_vocab(small, 8) == 1);
  CHECK(synthetic_ctr_vocab(small, 2) == 10131);
  small.vocab_scale = 100;
  CHECK(synthetic_ctr_vocab(small, 2) == 1013122700);
}

TEST_CASE("zipf: rejection-inversion draws P(k) ~ k^-s, for any n and s > 0") {
  std::uint64_t state = 11;
  const auto uniform = [&state] { return static_cast<double>(next(state) >> 11) * 0x1.0p-53; };
  for (double s : {0.5, 1.0, 1.1, 2.0}) {
    CAPTURE(s);
    const ZipfSampler zipf(10, s);
    std::vector<double> seen(12, 0);
    const int draws = 200000;
    for (int i = 0; i < draws; ++i) ++seen[std::min<std::uint64_t>(zipf(uniform), 11)];
    CHECK(seen[0] == 0);  // ranks are 1..10
    CHECK(seen[11] == 0);
    const double norm = zipf_norm(10, s);
    for (int k = 1; k <= 10; ++k) {
      CAPTURE(k);
      CHECK(seen[k] / draws == doctest::Approx(std::pow(k, -s) / norm).epsilon(0.05));
    }
  }
  // A billion values: O(1) per draw, the head as the law says, a long tail.
  const ZipfSampler huge(1000000000, 1.1);
  std::map<std::uint64_t, double> seen;
  std::uint64_t largest = 0, smallest = 1000000000;
  for (int i = 0; i < 200000; ++i) {
    const auto k = huge(uniform);
    largest = std::max(largest, k);
    smallest = std::min(smallest, k);
    seen[k] += 1;
  }
  CHECK(smallest == 1);
  CHECK(largest <= 1000000000);
  CHECK(seen[1] / 200000 == doctest::Approx(1 / zipf_norm(1e9, 1.1)).epsilon(0.05));
  CHECK(seen[1] / seen[2] == doctest::Approx(std::pow(2, 1.1)).epsilon(0.08));
  CHECK(largest > 100000000);
  const ZipfSampler one(1, 1.1);
  CHECK(one(uniform) == 1);
  CHECK_THROWS_AS(ZipfSampler(0, 1.1), std::invalid_argument);
  CHECK_THROWS_AS(ZipfSampler(5, 0), std::invalid_argument);
}

TEST_CASE("synthetic-ctr: write_criteo_tsv writes what the criteo reader reads back") {
  TempDir dir;
  for (bool log : {true, false}) {
    CAPTURE(log);
    DataConfig config = ctr_config();
    config.log_integers = log;
    const Dataset data = make_synthetic_ctr(config, false, 0, 3000);
    for (const char* name : {"ctr.txt", "ctr.txt.gz"}) {
      CAPTURE(name);
      const auto path = dir.path() / name;
      write_criteo_tsv(data, path);
      const Dataset back = read_criteo(path, {.test_split = true, .log_integers = log});
      REQUIRE(back.size() == data.size());
      CHECK(back.labels == data.labels);
      CHECK(back.images == data.images);
      // Each id comes back as the reader's hash of its 16 hex digits: one
      // to one within each field.
      std::vector<std::map<std::uint64_t, std::uint64_t>> forward(kCtrCategorical),
          backward(kCtrCategorical);
      bool consistent = true;
      for (std::size_t i = 0; i < data.size(); ++i) {
        for (std::size_t f = 0; f < kCtrCategorical; ++f) {
          const std::uint64_t a = data.sample_ids(i)[f], b = back.sample_ids(i)[f];
          consistent = consistent && b == ctr_id(f, a) &&
                       forward[f].emplace(a, b).first->second == b &&
                       backward[f].emplace(b, a).first->second == a;
        }
      }
      CHECK(consistent);
    }
  }
  // The file: 40 tab-separated fields a line, missing integers empty, ids
  // as 16 hex digits.
  const Dataset data = make_synthetic_ctr(ctr_config(), true, 0, 200);
  write_criteo_tsv(data, dir.path() / "plain.txt");
  std::ifstream in(dir.path() / "plain.txt");
  std::string line;
  std::size_t lines = 0, empty_integers = 0;
  while (std::getline(in, line)) {
    CHECK(std::count(line.begin(), line.end(), '\t') == 39);
    CHECK(line[0] == (data.labels[lines] != 0 ? '1' : '0'));
    CHECK(line.size() > 26 * 17);
    const auto last_tab = line.rfind('\t');
    CHECK(line.size() - last_tab - 1 == 16);
    empty_integers += line.find("\t\t") != std::string::npos;
    ++lines;
  }
  CHECK(lines == 200);
  CHECK(empty_integers > 100);
  // Only synthetic-ctr has the integers the file needs.
  CHECK_THROWS_AS(write_criteo_tsv(make_synthetic(10, true), dir.path() / "x.txt"),
                  std::invalid_argument);
  CHECK_THROWS_AS(write_criteo_tsv(data, dir.path() / "no" / "such" / "dir.txt"), DataError);
}
