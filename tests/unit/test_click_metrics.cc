// exact_auc against a count over every pair, and mean_logloss against the
// textbook formula.
#include <doctest/doctest.h>

#include <random>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "client/data/click_metrics.h"

using namespace pstrain;

namespace {

// The fraction of (positive, negative) pairs the positive wins, ties half.
double pair_auc(const std::vector<float>& scores, const std::vector<std::int32_t>& labels) {
  double wins = 0, pairs = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] == 0) continue;
    for (std::size_t j = 0; j < scores.size(); ++j) {
      if (labels[j] != 0) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1 : scores[i] == scores[j] ? 0.5 : 0;
    }
  }
  return wins / pairs;
}

}  // namespace

TEST_CASE("click metrics: exact_auc is the pair count, ties counting one half") {
  // By hand: positives 0.8, 0.5 (tied with a negative), 0.2; negatives 0.5,
  // 0.1. Pairs won: 0.8 > both (2), 0.5 ties 0.5 (0.5) and beats 0.1 (1),
  // 0.2 loses to 0.5 and beats 0.1 (1): 4.5 of 6.
  const std::vector<float> scores = {0.8f, 0.5f, 0.2f, 0.5f, 0.1f};
  const std::vector<std::int32_t> labels = {1, 1, 1, 0, 0};
  CHECK(exact_auc(scores, labels) == doctest::Approx(4.5 / 6));

  // Random sets with many ties (scores on a coarse grid), in any order.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const std::size_t n = 2 + rng() % 300;
    std::vector<float> s(n);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
      y[i] = static_cast<std::int32_t>(rng() % 3 == 0);
      // Positives score a little higher on average.
      s[i] = static_cast<float>(rng() % 8 + (y[i] != 0 ? rng() % 3 : 0)) / 4.0f;
    }
    y[0] = 1;
    y[1] = 0;
    INFO("trial " << trial << ", " << n << " samples");
    CHECK(exact_auc(s, y) == doctest::Approx(pair_auc(s, y)).epsilon(1e-12));
  }

  // Perfect, reversed and constant scores; a missing class.
  CHECK(exact_auc(std::vector<float>{1, 2, 3, 4}, std::vector<std::int32_t>{0, 0, 1, 1}) == 1.0);
  CHECK(exact_auc(std::vector<float>{4, 3, 2, 1}, std::vector<std::int32_t>{0, 0, 1, 1}) == 0.0);
  CHECK(exact_auc(std::vector<float>{1, 1, 1}, std::vector<std::int32_t>{0, 1, 0}) == 0.5);
  CHECK(std::isnan(exact_auc(std::vector<float>{1, 2}, std::vector<std::int32_t>{1, 1})));
  CHECK_THROWS_AS(exact_auc(std::vector<float>{1, 2}, std::vector<std::int32_t>{1}),
                  std::invalid_argument);
}

TEST_CASE("click metrics: mean_logloss is the mean binary cross-entropy of the logits") {
  std::mt19937_64 rng(3);
  std::vector<float> logits;
  std::vector<std::int32_t> labels;
  for (int i = 0; i < 1000; ++i) {
    logits.push_back(static_cast<float>(static_cast<double>(rng() % 20001) / 1000.0 - 10.0));
    labels.push_back(static_cast<std::int32_t>(rng() % 2));
  }
  double naive = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double p = 1 / (1 + std::exp(-static_cast<double>(logits[i])));
    naive -= labels[i] != 0 ? std::log(p) : std::log(1 - p);
  }
  naive /= static_cast<double>(logits.size());
  CHECK(mean_logloss(logits, labels) == doctest::Approx(naive).epsilon(1e-9));

  // Stable where the naive formula is not: log(1 - sigmoid(100)) is -inf
  // in double, the loss is 100.
  CHECK(mean_logloss(std::vector<float>{100.0f}, std::vector<std::int32_t>{0}) ==
        doctest::Approx(100.0));
  CHECK(mean_logloss(std::vector<float>{-100.0f}, std::vector<std::int32_t>{1}) ==
        doctest::Approx(100.0));
  CHECK(mean_logloss(std::vector<float>{0.0f}, std::vector<std::int32_t>{1}) ==
        doctest::Approx(std::log(2.0)));
  CHECK(mean_logloss(std::vector<float>{}, std::vector<std::int32_t>{}) == 0.0);
  CHECK_THROWS_AS(mean_logloss(std::vector<float>{1}, std::vector<std::int32_t>{}),
                  std::invalid_argument);
}
