#include "client/train/step_strategy.h"

#include "client/train/ps_step.h"
#include "client/train/replica_step.h"
#include "shared/modes.h"

namespace pstrain {

std::unique_ptr<StepStrategy> make_step_strategy(const TrainContext& context,
                                                 StepMetrics& metrics) {
  if (traits(context.config.mode).allreduce())
    return std::make_unique<ReplicaStep>(context, metrics);
  return std::make_unique<PsStep>(context, metrics);
}

}  // namespace pstrain
