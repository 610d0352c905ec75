// Weight prediction for pipelined steps (client/train/weight_predictor.h):
// weights moving by a constant step are predicted exactly one step ahead,
// and nothing is predicted without an earlier landing, where the caller
// says not to (the last step), with `ahead` 0, or after forget().
#include <doctest/doctest.h>

#include <span>
#include <stdexcept>
#include <vector>

#include "client/train/weight_predictor.h"

using namespace pstrain;

namespace {

// `values` as the pieces they landed in: one, or cut at `cut`.
std::vector<std::span<const float>> pieces(const std::vector<float>& values, std::size_t cut = 0) {
  const std::span<const float> all(values);
  if (cut == 0) return {all};
  return {all.first(cut), all.subspan(cut)};
}

}  // namespace

TEST_CASE("weight prediction: continues each variable along its last change") {
  WeightPredictor predictor(2, 1.0f);
  std::vector<float> out(3);
  // The first landing of a variable has no change to continue.
  predictor.land(0, pieces({1, 2, 3}), out, true);
  CHECK(out == std::vector<float>{1, 2, 3});
  // Weights that moved by (0.5, -1, 0) since: predicted one more such step on.
  predictor.land(0, pieces({1.5f, 1, 3}), out, true);
  CHECK(out == std::vector<float>{2, 0, 3});
  // Each variable has its own earlier landing.
  std::vector<float> other(1);
  predictor.land(1, pieces({7}), other, true);
  CHECK(other == std::vector<float>{7});
  // Not predicting still remembers the landing: the next change is from it.
  predictor.land(0, pieces({2, 0, 3}), out, false);
  CHECK(out == std::vector<float>{2, 0, 3});
  predictor.land(0, pieces({2.25f, -0.5f, 3}), out, true);
  CHECK(out == std::vector<float>{2.5f, -1, 3});
  // A re-pull is no step's change.
  predictor.forget();
  predictor.land(0, pieces({4, 4, 4}), out, true);
  CHECK(out == std::vector<float>{4, 4, 4});
  // Values landed in pieces (chunks in their messages) read as one.
  predictor.land(0, pieces({5, 6, 4}, 1), out, true);
  CHECK(out == std::vector<float>{6, 8, 4});
  predictor.land(0, pieces({5, 6, 4}, 2), out, true);
  CHECK(out == std::vector<float>{5, 6, 4});
  CHECK_THROWS_AS(predictor.land(0, pieces({1, 2}), out, true), std::invalid_argument);
}

TEST_CASE("weight prediction: `ahead` scales the step; 0 lands the weights as they are") {
  std::vector<float> out(1);
  WeightPredictor twice(1, 2.0f);
  twice.land(0, pieces({1}), out, true);
  twice.land(0, pieces({3}), out, true);
  CHECK(out[0] == 7);
  WeightPredictor none(1, 0.0f);
  none.land(0, pieces({1}), out, true);
  none.land(0, pieces({3}), out, true);
  CHECK(out[0] == 3);
}
