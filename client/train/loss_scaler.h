#pragma once
// Dynamic loss scaling for fp16 training (train.precision: fp16), with the
// schedule of PyTorch's GradScaler: the loss gradient is multiplied by
// scale() so that small gradients survive fp16's narrow range, the
// gradients are divided by it again before the optimizer, and a step whose
// gradients hold an infinity or a NaN (an fp16 overflow) is skipped and the
// scale halved; after growth_interval finite steps in a row it doubles.
// bf16 has float32's range and needs none of this.
//
// Host-side and single-threaded: the trainer's thread owns it.
#include <cstdint>

#include "shared/metrics_registry.h"

namespace pstrain {

struct LossScalerOptions {
  double initial = 65536;
  double growth = 2;
  double backoff = 0.5;
  std::uint32_t growth_interval = 2000;
};

class LossScaler {
 public:
  // Registers pstrain_worker_skipped_steps_total (steps skipped for an
  // overflow) and pstrain_worker_loss_scale (the scale) in `registry`.
  explicit LossScaler(MetricsRegistry& registry, LossScalerOptions options = {});

  float scale() const { return static_cast<float>(scale_); }
  // After a step whose gradients were computed at scale(): `finite` whether
  // every gradient was finite. Returns whether the step is to be applied
  // (false: skipped), and moves the scale for the next step.
  bool update(bool finite);
  std::uint64_t skipped() const { return static_cast<std::uint64_t>(skipped_.value()); }

 private:
  LossScalerOptions options_;
  double scale_;
  std::uint32_t good_steps_ = 0;  // finite steps since the last change of scale
  Counter& skipped_;
  Gauge& gauge_;
};

}  // namespace pstrain
