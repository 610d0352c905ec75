#include "shared/modes.h"

#include <stdexcept>
#include <string>

namespace pstrain {
namespace {

constexpr ModeTraits kModes[] = {
    {Mode::async, ServerPolicy::async, WorkerStrategy::through_ps, WorkerLoss::continue_},
    {Mode::sync, ServerPolicy::async, WorkerStrategy::allreduce, WorkerLoss::fail},
    {Mode::ssp, ServerPolicy::ssp, WorkerStrategy::through_ps, WorkerLoss::continue_},
    {Mode::backup, ServerPolicy::backup, WorkerStrategy::through_ps, WorkerLoss::continue_},
    {Mode::local_sgd, ServerPolicy::async, WorkerStrategy::local_sgd, WorkerLoss::fail},
};

}  // namespace

const ModeTraits& traits(Mode mode) {
  for (const ModeTraits& t : kModes)
    if (t.mode == mode) return t;
  throw std::logic_error("no traits for mode " + std::to_string(static_cast<int>(mode)));
}

}  // namespace pstrain
