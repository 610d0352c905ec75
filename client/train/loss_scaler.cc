#include "client/train/loss_scaler.h"

namespace pstrain {

LossScaler::LossScaler(MetricsRegistry& registry, LossScalerOptions options)
    : options_(options),
      scale_(options.initial),
      skipped_(registry
                   .counter("pstrain_worker_skipped_steps_total",
                            "fp16 steps skipped because a gradient overflowed (inf or NaN).")
                   .with()),
      gauge_(registry
                 .gauge("pstrain_worker_loss_scale",
                        "fp16 loss scale: the factor on the loss gradient of the next step.")
                 .with()) {
  gauge_.set(scale_);
}

bool LossScaler::update(bool finite) {
  if (!finite) {
    skipped_.add();
    scale_ *= options_.backoff;
    good_steps_ = 0;
  } else if (++good_steps_ == options_.growth_interval) {
    scale_ *= options_.growth;
    good_steps_ = 0;
  }
  gauge_.set(scale_);
  return finite;
}

}  // namespace pstrain
