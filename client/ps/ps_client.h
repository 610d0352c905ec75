#pragma once
// PsClient: a worker's view of the parameter servers, in the spirit of
// ps-lite's KVWorker. Calls are by variable name; the client cuts them into
// chunks with the shard map and keeps requests to every ps in flight at once.
//
//   PsClient ps(config, /*sender=*/worker_index, map);
//   ps.hello();                      // handshake with every ps
//   ps.init(seed);                   // create-if-absent from the seeded generator
//   auto t = ps.push_pull("dense0/w", grad, weights);
//   ps.wait(t);
//
// Buffers belong to the library from the call until wait() on its ticket
// returns: payloads are sent from them without copies (ZeroMQ zero-copy
// frames) and pulled values are written once into them. A PsClient is used by
// one thread; other threads (an evaluator) make their own. ZeroMQ stays
// entirely behind this interface.
//
// Failures: every wait has a deadline. A data request (init, pull, push,
// push_pull, assign) unanswered after retry_interval_s is resent, then after
// twice as long, and so on up to timeout_s / 4; the ps answers a resent
// update from its record instead of applying it twice (server/dedup.h). A
// call fails with PsError naming the ps when that ps has not answered for
// timeout_s. A ps that does not read what was sent to it (stalled: it holds
// frames and sent no reply for retry_interval_s) keeps ZeroMQ from releasing
// the caller's buffers; its socket is then replaced, which frees them.
// Control operations are not resent.
//
// Restarts: every reply carries its ps's generation (wire::Header), new at
// every ps start. The client remembers the latest per ps; a change means the
// ps restarted and may hold other values than this worker last saw (and its
// record of applied requests started empty, so an update resent to it is
// applied there, once). Calls do not fail on a change: the caller asks
// take_generation_change() between steps and decides (re-pull, or refuse a
// ps that lost its state), so one check point covers every call of a step.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shared/config.h"
#include "shared/curve_keys.h"
#include "shared/error.h"
#include "shared/shard_map.h"

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
  FaultConfig fault;  // for tests (net.fault): off by default
  std::uint64_t fault_seed = 0;
  // security.curve: this client's key pair and every ps's public key (by ps
  // index); every socket then speaks CURVE. None: plain TCP.
  struct Curve {
    CurveKeyPair own;
    std::vector<std::string> server_keys;
  };
  std::optional<Curve> curve;
};

// What a worker's client takes from the cluster config: every ps's address,
// and its sender, timeouts, config text, fault injection and, under
// security.curve, its keys (shared/curve_keys.h: a worker's own for a worker
// index, the tool's for any other sender; throws CurveKeyError naming the
// file that is missing or malformed).
std::vector<std::string> ps_addresses(const ClusterConfig& config);
PsClientOptions client_options(const ClusterConfig& config, std::uint32_t sender);

class PsClient {
 public:
  using Ticket = std::uint64_t;

  PsClient(std::vector<std::string> ps_addresses, ShardMap map, std::uint64_t run_id,
           PsClientOptions options = {});
  // Addresses, run id (ClusterConfig::run_id) and client_options() from the config.
  PsClient(const ClusterConfig& config, std::uint32_t sender, ShardMap map);
  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  const ShardMap& map() const;

  // Protocol version and run id handshake with every ps; throws PsError
  // naming the ps and what differs, or why the ps refuses this worker
  // index: held by another live process, asked again meanwhile for up to
  // takeover_grace_s (server/coordinator.h). Returns, per ps, the updates its chunks
  // hold (0: fresh values). Each hello also tells the ps how many updates it
  // acknowledged to this client, so a ps restored from a checkpoint logs
  // and counts the ones its restore lost.
  std::vector<std::uint64_t> hello();
  std::uint64_t hello(std::uint32_t server);  // the same with one ps
  // Chunk updates (push, push_pull, assign) ps `server` acknowledged.
  std::uint64_t acked_updates(std::uint32_t server) const;
  // Creates every chunk that does not exist yet from the counter-based
  // generator (seed, variable, element); waits.
  void init(std::uint64_t seed);

  Ticket pull(std::string_view variable, std::span<float> out);
  Ticket push(std::string_view variable, std::span<const float> grad);
  Ticket push_pull(std::string_view variable, std::span<const float> grad, std::span<float> out);
  Ticket assign(std::string_view variable, std::span<const float> values);
  // The worker's clock: the steps it completed before the one its next
  // pulls and pushes are for. Every data request carries it (with a push,
  // also the chunk version the gradient was computed on), which mode ssp's
  // servers hold pulls by (shared/messages.h, ChunkRequest). 0 until set.
  void set_clock(std::uint64_t steps_done);
  void wait(Ticket ticket);
  void wait_all();
  // Gives up on every call in flight without waiting for its replies, for
  // a caller leaving on an error: replies still to come are ignored, the
  // sockets of servers still holding zero-copy frames are replaced (which
  // makes ZeroMQ drop them), and it returns once ZeroMQ has released every
  // frame, within timeout_s. The abandoned updates may or may not have been
  // applied; waiting for their tickets afterwards returns at once.
  void abandon_all();

  // The generation ps `server`'s replies carry: the first reply's, or the
  // latest after a change; 0 before any reply.
  std::uint64_t generation(std::uint32_t server) const;
  // Whether ps `server`'s generation changed since the previous call (the
  // first reply's generation is not a change): true once per change.
  bool take_generation_change(std::uint32_t server);

  // Staleness of the last push (push or push_pull) of `variable`: updates
  // other workers applied between this client's pull and its push, summed
  // over the variable's chunks and divided by their number.
  double last_staleness(std::string_view variable) const;

  // Control operations; each waits for its reply.
  // Waits on ps 0 until `count` senders entered barrier `name`, with no
  // timeout of its own: it heartbeats every ps while it waits and calls
  // `while_waiting` with the global sample count each time.
  void barrier(const std::string& name, std::uint32_t count,
               const std::function<void(std::uint64_t global_samples)>& while_waiting = {});
  // Liveness and progress, sent to every ps; returns the global samples
  // counted by ps 0 so far (this call's samples included).
  std::uint64_t heartbeat(std::uint64_t samples_since_last);
  // Tells every ps that this worker pushed its last step (a ps in mode
  // backup stops waiting for its gradients; wire::Heartbeat).
  void finished_pushing();
  // Progress to ps 0 alone, which keeps the global count (the heartbeat
  // thread, client/ps/heartbeat.h, keeps every ps aware the worker lives);
  // returns the global samples so far, this report's included.
  std::uint64_t report_samples(std::uint64_t samples_since_last);
  // This worker's samples as ps 0 counted them (restored from a checkpoint
  // included): where a restarted worker resumes its shard.
  std::uint64_t samples_counted();
  void done(std::uint64_t total_samples);  // tells every ps this worker finished
  // Sets `key` in this sender's namespace of ps 0's store (wire::kv_key).
  void kv_set(const std::string& key, std::span<const std::uint8_t> value);
  // Waits up to `timeout_s` (>= 0, at most a day; whole milliseconds on the
  // wire) on ps 0 for `key` as sender `writer` set it; throws PsError when
  // it is not set by then.
  std::vector<std::uint8_t> kv_get(std::uint32_t writer, const std::string& key, double timeout_s);
  std::string snapshot(std::uint32_t server);  // returns the snapshot's path
  std::string stats(std::uint32_t server);     // JSON
  void shutdown(std::uint32_t server);

 private:
  // A heartbeat of `samples` to ps 0: (global samples, this worker's).
  std::pair<std::uint64_t, std::uint64_t> heartbeat_ps0(std::uint64_t samples);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pstrain
