#include "client/train/step_graphs.h"

#include <exception>
#include <utility>

#include "shared/log.h"

namespace pstrain {

StepGraphs::StepGraphs(Backend& backend, int batch_size, std::string what, Work work)
    : backend_(backend), batch_size_(batch_size), what_(std::move(what)), work_(std::move(work)) {}

StepGraphs::Ran StepGraphs::run(int n, const StepScalars& scalars) {
  if (n != batch_size_ || failed_ || !warmed_up_) {
    warmed_up_ = warmed_up_ || n == batch_size_;
    work_(n, scalars);
    return Ran::eager;
  }
  if (graph_) {
    graph_->run(scalars);
    return Ran::replayed;
  }
  try {
    graph_ = backend_.make_step_graph([this, n](const StepScalars& s) { work_(n, s); });
    graph_->run(scalars);
    return Ran::recorded;
  } catch (const std::exception& e) {
    // Nothing of the step was issued: it runs eagerly, as all later ones.
    graph_.reset();
    failed_ = true;
    log("train.cuda_graphs: recording the ", what_, " of a batch of ", n, " on ", backend_.name(),
        " failed (", e.what(), "); its steps run eagerly");
    work_(n, scalars);
    return Ran::eager;
  }
}

}  // namespace pstrain
