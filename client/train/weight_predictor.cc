#include "client/train/weight_predictor.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pstrain {

WeightPredictor::WeightPredictor(std::size_t variables, float ahead)
    : ahead_(ahead), before_(variables) {}

void WeightPredictor::land(std::size_t v, std::span<const float> landed, std::span<float> out,
                           bool predict) {
  if (out.size() != landed.size())
    throw std::invalid_argument("weight prediction: " + std::to_string(landed.size()) +
                                " landed values for " + std::to_string(out.size()) + " weights");
  auto& before = before_.at(v);
  if (predict && ahead_ > 0 && before.size() == landed.size()) {
    for (std::size_t k = 0; k < landed.size(); ++k)
      out[k] = landed[k] + ahead_ * (landed[k] - before[k]);
  } else {
    std::ranges::copy(landed, out.begin());
  }
  before.assign(landed.begin(), landed.end());
}

void WeightPredictor::forget() {
  for (auto& b : before_) b.clear();
}

}  // namespace pstrain
