#include "client/train/host_views.h"

#include <exception>

#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "shared/log.h"

namespace pstrain {

HostViews::HostViews(Backend& backend, Model& model, bool grads)
    : direct_(backend.host_accessible()) {
  const auto& vars = model.variables();
  auto view = [&](DeviceMemory& memory, std::size_t n) -> std::span<float> {
    if (direct_) return {memory.data(), n};
    staging_.push_back(backend.alloc_host(n * sizeof(float)));
    return {staging_.back().data(), n};
  };
  for (std::size_t i = 0; i < vars.size(); ++i) {
    weights_.push_back(view(model.param(i), vars[i].size));
    if (grads) grads_.push_back(view(model.grad(i), vars[i].size));
  }
}

PsRequestsGuard::PsRequestsGuard(PsClient& ps) : ps_(ps), exceptions_(std::uncaught_exceptions()) {}

PsRequestsGuard::~PsRequestsGuard() {
  if (std::uncaught_exceptions() <= exceptions_) return;
  try {
    ps_.abandon_all();
  } catch (const std::exception& e) {  // a ZeroMQ error: nothing is left to free
    log("while unwinding, abandoning the ps requests failed too: ", e.what());
  }
}

}  // namespace pstrain
