#pragma once
// WeightPredictor: train.weight_prediction for pipelined steps
// (client/train/ps_step.h). A pipelined step computes on weights that lack
// the update of the step before, still in flight; it computes instead on
// the landed weights continued along their last change,
//
//   w + ahead x (w - w_before),
//
// w_before being what the variable's previous landing brought (PipeDream-2BW,
// Narayanan et al. 2021; SpecTrain, Chen et al. 2018). The change between
// two landings is every worker's updates over one of this worker's steps,
// so `ahead` 1 stands in for one step of them. The ps never sees the
// prediction: the versions a push carries stay those of the landed weights.
//
// Thread rules: none (the training thread's).
#include <cstddef>
#include <span>
#include <vector>

namespace pstrain {

class WeightPredictor {
 public:
  // `variables`: how many the model has; `ahead` >= 0 (0: land as is).
  WeightPredictor(std::size_t variables, float ahead);

  // Variable v's weights `landed` (in pieces, in order, as they arrived:
  // client/ps/received_values.h) go into `out` (their size): continued
  // where `predict` and an earlier landing of v is known, else as they are.
  // Either way `landed` becomes v's earlier landing.
  void land(std::size_t v, std::span<const std::span<const float>> landed, std::span<float> out,
            bool predict);
  // Forgets every earlier landing: values pulled anew (a ps restarted) are
  // not a step's change to continue.
  void forget();

 private:
  float ahead_;
  std::vector<std::vector<float>> before_;  // per variable; empty: none landed
};

}  // namespace pstrain
