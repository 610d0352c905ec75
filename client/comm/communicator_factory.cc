#include "client/comm/communicator_factory.h"

#include "client/comm/gloo_communicator.h"
#include "client/comm/rendezvous.h"
#include "client/compute/cuda_loader.h"

namespace pstrain {

std::unique_ptr<Communicator> make_communicator(const ClusterConfig& config, std::uint32_t index,
                                                Backend& backend, KvStore& store,
                                                const std::string& prefix) {
  if (!backend.host_accessible()) {
    const auto id = share_nccl_id(store, prefix, index, config.net.request_timeout);
    return cuda::make_nccl_communicator(backend, id, static_cast<int>(index),
                                        static_cast<int>(config.workers.size()),
                                        config.net.request_timeout);
  }
  const auto options = gloo_options(config, index);
  return std::make_unique<GlooCommunicator>(
      options, std::make_shared<RendezvousStore>(store, prefix, options.timeout));
}

}  // namespace pstrain
