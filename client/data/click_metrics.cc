#include "client/data/click_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace pstrain {

namespace {
void check_sizes(std::size_t scores, std::size_t labels) {
  if (scores != labels)
    throw std::invalid_argument(std::to_string(scores) + " scores for " + std::to_string(labels) +
                                " labels");
}
}  // namespace

double exact_auc(std::span<const float> scores, std::span<const std::int32_t> labels) {
  check_sizes(scores.size(), labels.size());
  // A NaN has no place in an order (and would break the sort's).
  if (std::ranges::any_of(scores, [](float s) { return std::isnan(s); }))
    return std::numeric_limits<double>::quiet_NaN();
  std::vector<std::uint32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0u);
  std::ranges::sort(order, [&](std::uint32_t a, std::uint32_t b) { return scores[a] < scores[b]; });
  // The positives' ranks (1-based, ties sharing their mean rank), summed:
  // U = rank_sum - P(P+1)/2 pairs where a positive is above a negative.
  double rank_sum = 0, positives = 0;
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    double tied_positives = 0;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) {
      tied_positives += labels[order[j]] != 0 ? 1 : 0;
      ++j;
    }
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    rank_sum += tied_positives * mean_rank;
    positives += tied_positives;
    i = j;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

double mean_logloss(std::span<const float> logits, std::span<const std::int32_t> labels) {
  check_sizes(logits.size(), labels.size());
  if (logits.empty()) return 0;
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i];
    sum += std::log1p(std::exp(-std::fabs(z))) + std::max(z, 0.0) - (labels[i] != 0 ? z : 0.0);
  }
  return sum / static_cast<double>(logits.size());
}

}  // namespace pstrain
