#include "client/ps/ps_client.h"

#include <utility>

namespace pstrain {

PsClient::PsClient(std::vector<std::string> ps_addresses, ShardMap map, std::uint64_t run_id,
                   PsClientOptions options)
    : detail::ChannelHolder{std::make_unique<PsChannel>(std::move(ps_addresses), run_id,
                                                        std::move(options))},
      PsDataClient(*channel, std::move(map)),
      PsControlClient(*channel) {}

PsClient::PsClient(const ClusterConfig& config, std::uint32_t sender, ShardMap map)
    : PsClient(ps_addresses(config), std::move(map), config.run_id(),
               client_options(config, sender)) {}

}  // namespace pstrain
