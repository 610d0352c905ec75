#pragma once
// PsClient: a worker's view of the parameter servers, by concern:
//   - the data path (PsDataClient, client/ps/data_client.h): init, pull,
//     push, push_pull, assign by variable name, cut into chunks and in
//     flight to every ps at once;
//   - the control path (PsControlClient, client/ps/control_client.h):
//     hello, barriers, heartbeats, progress, done, the kv store
//     (client/ps/kv_store.h), snapshots, stats;
// both over one channel (PsChannel, client/ps/ps_channel.h: sockets,
// zero-copy frames, resends, deadlines, restarts, ZeroMQ kept behind it).
//
//   PsClient ps(config, /*sender=*/worker_index, map);
//   ps.hello();                      // handshake with every ps
//   ps.init(seed);                   // create-if-absent from the seeded generator
//   auto t = ps.push_pull("dense0/w", grad, weights);
//   ps.wait(t);
//
// Code that needs one concern takes that part (a PsDataClient&, a
// KvStore&). A PsClient is used by one thread; other threads (an
// evaluator, the heartbeat thread) make their own.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/ps/control_client.h"
#include "client/ps/data_client.h"
#include "client/ps/ps_channel.h"
#include "client/ps/ps_options.h"
#include "shared/config.h"
#include "shared/shard_map.h"

namespace pstrain {

namespace detail {
// Constructed before the clients, which hold references to it.
struct ChannelHolder {
  std::unique_ptr<PsChannel> channel;
};
}  // namespace detail

class PsClient : private detail::ChannelHolder, public PsDataClient, public PsControlClient {
 public:
  using Ticket = PsDataClient::Ticket;

  PsClient(std::vector<std::string> ps_addresses, ShardMap map, std::uint64_t run_id,
           PsClientOptions options = {});
  // Addresses, run id (ClusterConfig::run_id) and client_options() from the config.
  PsClient(const ClusterConfig& config, std::uint32_t sender, ShardMap map);

  // The ps serving ps `server`'s shard (PsChannel::serving): itself, or its
  // backup after a fail-over.
  std::uint32_t serving(std::uint32_t server) const { return channel->serving(server); }
};

}  // namespace pstrain
