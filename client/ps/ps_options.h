#pragma once
// What a ps client is configured with, and the error its calls throw.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shared/config.h"
#include "shared/curve_keys.h"
#include "shared/embedding.h"
#include "shared/error.h"

namespace pstrain {

// An error reply, a timeout or a broken peer; the message names the ps (index
// and address), the operation and the variable.
struct PsError : pstrain::Error {
  using pstrain::Error::Error;
};

struct PsClientOptions {
  std::uint32_t sender = 0;     // worker index, sent with every request
  double timeout_s = 30;        // a ps silent for this long is an error
  double retry_interval_s = 1;  // a data request unanswered this long is resent (doubling)
  // The resolved config (ClusterConfig::to_yaml), sent with hello so a ps
  // whose config differs can say which keys differ.
  std::string config_yaml;
  // How long hello asks again after a temporary refusal (a worker index
  // whose previous process the ps has not yet seen silent: a restart right
  // after a crash), counted from the first; 0: it does not.
  double takeover_grace_s = 0;
  // net.wire_dtype: what pull, push and push_pull carry. bf16 or fp16: the
  // client rounds gradients before it sends them (into a buffer of its own,
  // the caller's stays as it was) and widens the values it receives.
  WireDType wire_dtype = WireDType::fp32;
  // net.compression: how push and push_pull send gradients instead (their
  // replies' values come as float32 then); none: as wire_dtype says.
  Compression compression = {};
  // replication.replicas 2 (fail-over, client/ps/ps_channel.h): a ps silent
  // this long with data requests in flight gets them sent to its backup too;
  // 0: no fail-over.
  double failover_after_s = 0;
  std::uint32_t io_threads = 1;  // of the channel's ZeroMQ context (net.io_threads)
  FaultConfig fault;             // for tests (net.fault): off by default
  std::uint64_t fault_seed = 0;
  // security.curve: this client's key pair and every ps's public key (by ps
  // index); every socket then speaks CURVE. None: plain TCP.
  struct Curve {
    CurveKeyPair own;
    std::vector<std::string> server_keys;
  };
  std::optional<Curve> curve;
  // The run's embedding tables and the seed their rows are placed by
  // (shared/embedding.h, row_home): train.seed.
  std::vector<TableSpec> tables = {};
  std::uint64_t table_seed = 0;
};

// What a worker's client takes from the cluster config: every ps's address,
// and its sender, timeouts, config text, fault injection and, under
// security.curve, its keys (shared/curve_keys.h: a worker's own for a worker
// index, the tool's for any other sender; throws CurveKeyError naming the
// file that is missing or malformed).
std::vector<std::string> ps_addresses(const ClusterConfig& config);
PsClientOptions client_options(const ClusterConfig& config, std::uint32_t sender);

}  // namespace pstrain
