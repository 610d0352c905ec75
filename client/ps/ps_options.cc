#include "client/ps/ps_options.h"

#include <thread>
#include <utility>

namespace pstrain {

std::vector<std::string> ps_addresses(const ClusterConfig& config) {
  std::vector<std::string> out;
  for (const auto& ps : config.ps) out.push_back(ps.connect_address());
  return out;
}

PsClientOptions client_options(const ClusterConfig& config, std::uint32_t sender) {
  std::optional<PsClientOptions::Curve> curve;
  if (config.security.curve) {
    const auto dir = keys_dir(config);
    const auto list = read_public_keys(dir);
    curve.emplace();
    curve->own = read_key_pair(dir, client_identity(config, sender));
    for (std::uint32_t s = 0; s < config.ps.size(); ++s)
      curve->server_keys.push_back(public_key_of(list, {Identity::Role::ps, s}, dir));
  }
  return {
      .sender = sender,
      .timeout_s = config.net.request_timeout,
      .retry_interval_s = config.net.retry_interval,
      .config_yaml = config.to_yaml(),
      .takeover_grace_s = 2 * takeover_silence(config.net),
      .wire_dtype = config.net.wire_dtype,
      .compression = config.net.compression,
      // Half the backup's wait before it takes over: the worker is asking
      // by the time the backup may answer.
      .failover_after_s =
          config.replication.replicas > 1 ? config.replication.backup_silence / 2 : 0,
      .io_threads = io_threads(config.net.io_threads, static_cast<std::uint32_t>(config.ps.size()),
                               std::thread::hardware_concurrency()),
      .fault = config.net.fault,
      .fault_seed = config.train.seed ^ (0xc2b2ae3d27d4eb4fULL * (sender + 1)),
      .curve = std::move(curve),
      .tables = config.tables,
      .table_seed = config.train.seed};
}

}  // namespace pstrain
