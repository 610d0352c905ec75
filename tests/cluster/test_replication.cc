// Replicated shards (replication.replicas: 2, server/replicator.h) against
// real `pstrain --role ps` processes: with a tenth of the messages dropped,
// the exactness workload ends exact on the primaries, and every ps's copy of
// the shard before it in the ring holds the same bits and versions as that
// shard's primary; under CURVE the forwards are admitted (no backup given
// up).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstring>

#include "client/ps/ps_client.h"
#include "server/replicator.h"
#include "tests/support/exact_pushes.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

// Pulls chunk `index` of `name` through `peer`: its values' bytes and version.
std::optional<std::pair<std::vector<std::uint8_t>, std::uint64_t>> pull(RawPeer& peer,
                                                                        const ClusterConfig& config,
                                                                        const std::string& name,
                                                                        std::uint32_t index) {
  wire::Header h;
  h.op = wire::Op::pull;
  h.request_id = 1;
  h.run_id = config.hash();
  wire::ChunkRequest{name, index}.write(h);
  // net.fault.drop loses replies to this peer too: asked again, as a
  // client would (a pull changes nothing).
  for (int attempt = 0; attempt < 8; ++attempt) {
    const auto reply = peer.exchange({wire::encode_header(h)});
    if (!reply) continue;
    if (reply->header.status != wire::Status::ok || reply->payload.size() != 1) break;
    return std::pair{reply->payload[0], wire::ChunkReply::read(reply->header).version};
  }
  return std::nullopt;
}

// Every chunk of every ps's shard, as its primary and its backup's copy
// hold it: what differs (empty: the copies are bit-equal, versions too).
std::string copy_mismatches(const ClusterConfig& config) {
  const auto map = shard_map_for(config, exact_push_variables());
  const auto servers = static_cast<std::uint32_t>(config.ps.size());
  std::string out;
  std::size_t compared = 0;
  for (std::uint32_t p = 0; p < servers; ++p) {
    const std::uint32_t b = (p + 1) % servers;
    RawPeer primary(config.ps[p].connect_address());
    RawPeer copy(config.ps[b].connect_address(), std::nullopt, ps::Replicator::peer_of(p));
    for (const auto& c : map.all_chunks()) {
      if (c.server != p) continue;
      const auto& name = map.variables()[c.variable].name;
      const std::string what = "'" + name + "' chunk " + std::to_string(c.index) + " of ps " +
                               std::to_string(p) + " (copy on ps " + std::to_string(b) + ")";
      const auto a = pull(primary, config, name, c.index);
      const auto z = pull(copy, config, name, c.index);
      if (!a || !z) {
        out += what + ": not held; ";
        continue;
      }
      if (a->first != z->first) out += what + ": values differ; ";
      if (a->second != z->second)
        out += what + ": version " + std::to_string(a->second) + " against " +
               std::to_string(z->second) + "; ";
      ++compared;
    }
  }
  if (compared == 0) out += "no chunk compared";
  return out;
}

void check_forwarded(PsClient& ps, std::uint32_t servers, std::uint64_t at_least) {
  for (std::uint32_t s = 0; s < servers; ++s) {
    const auto json = ps.stats(s);
    CAPTURE(json);
    CHECK(stat(json, "replica_forwards") >= at_least);
    CHECK(stat(json, "backup_losses") == 0);
    CHECK(stat(json, "replication_pending") == 0);
    CHECK(stat(json, "errors") == 0);
  }
}

}  // namespace

TEST_CASE("replication: every acknowledged update is on the backup, bit for bit") {
  PsCluster cluster({.ps = 3,
                     .workers = 3,
                     .optimizer = "sgd",
                     .lr = 1,
                     .retry_interval = 0.05,
                     .fault_drop = 0.1,
                     .replication = "{replicas: 2, backup_silence: 5}"});
  cluster.start_all();
  const auto& config = cluster.config();
  check_exact_pushes(config, 3, 60);
  PsClient check(config, kTool, shard_map_for(config, exact_push_variables()));
  check_forwarded(check, 3, 100);
  CHECK(copy_mismatches(config) == "");
}

TEST_CASE("replication: under CURVE a primary's forwards are admitted by its backup") {
  PsCluster cluster(
      {.ps = 2, .workers = 1, .curve = true, .replication = "{replicas: 2, backup_silence: 5}"});
  cluster.start_all();
  const auto& config = cluster.config();
  const auto map = shard_map_for(config, exact_push_variables());
  PsClient worker(config, 0, map);
  worker.hello();
  worker.init(1);
  std::vector<float> grad(40000, 1.0f), bias(10, 1.0f);
  for (int step = 0; step < 5; ++step) {
    worker.wait(worker.push("w", grad));
    worker.wait(worker.push("b", bias));
  }
  // Every chunk's init and five pushes, on both ps.
  check_forwarded(worker, 2, 6);
}
