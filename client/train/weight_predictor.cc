#include "client/train/weight_predictor.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pstrain {

WeightPredictor::WeightPredictor(std::size_t variables, float ahead)
    : ahead_(ahead), before_(variables) {}

void WeightPredictor::land(std::size_t v, std::span<const std::span<const float>> landed,
                           std::span<float> out, bool predict) {
  std::size_t size = 0;
  for (const auto& piece : landed) size += piece.size();
  if (out.size() != size)
    throw std::invalid_argument("weight prediction: " + std::to_string(size) +
                                " landed values for " + std::to_string(out.size()) + " weights");
  auto& before = before_.at(v);
  const bool continued = predict && ahead_ > 0 && before.size() == size;
  if (!continued) before.resize(size);
  std::size_t at = 0;
  for (const auto& piece : landed) {
    float* const to = out.data() + at;
    float* const was = before.data() + at;
    if (continued) {
      for (std::size_t k = 0; k < piece.size(); ++k) {
        to[k] = piece[k] + ahead_ * (piece[k] - was[k]);
        was[k] = piece[k];
      }
    } else {
      std::ranges::copy(piece, to);
      std::ranges::copy(piece, was);
    }
    at += piece.size();
  }
}

void WeightPredictor::forget() {
  for (auto& b : before_) b.clear();
}

}  // namespace pstrain
