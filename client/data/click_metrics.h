#pragma once
// Scores of a binary classifier (a click model) against its labels: the
// exact area under the ROC curve and the mean log loss, as click-through
// work reports them (docs/ctr.md).
#include <cstdint>
#include <span>

namespace pstrain {

// The probability that a positive sample scores above a negative one, ties
// counting one half (the Mann-Whitney statistic over every pair, computed by
// sorting the scores once: O(n log n)). Labels are 0 or 1; scores are any
// monotone measure (logits or probabilities). NaN when either class is
// absent or a score is NaN (a diverged model). Throws std::invalid_argument when the sizes differ.
double exact_auc(std::span<const float> scores, std::span<const std::int32_t> labels);

// The mean binary cross-entropy of logits against labels, computed stably
// (log(1 + e^-|z|) + max(z, 0) - z y) in double. 0 for no samples.
double mean_logloss(std::span<const float> logits, std::span<const std::int32_t> labels);

}  // namespace pstrain
