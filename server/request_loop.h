#pragma once
// The ps's request loop: its ZeroMQ ROUTER socket and everything that touches
// it. Each message goes through the dispatcher (server/dispatcher.h), which
// decodes and checks it, hands it to the handler its op has in handlers(),
// keeps the record of applied updates and answers resends and bad messages;
// replies come back through this loop, the ReplySink of every handler, and
// leave with the run id and the loop's generation stamped on them. The
// replies to one message leave together (shared/protocol.h), in messages of
// at most 256 KiB unless one reply is larger, each as soon as it is full or
// the message's requests are all handled. Reply frames leave without a copy, each holding a claim
// on the send budget (server/send_budget.h) until ZeroMQ has sent it; a reply with no room in the
// budget is dropped, counted and its peer logged once. The generation is fixed for the loop's
// lifetime, and so is the dispatcher's record: a resend is never answered from the record of
// another generation. Fault injection (net.fault, for tests) drops or delays data replies as they
// are sent.
//
//   RequestLoop loop({.ps_index = 0, .run_id = config.run_id(), ...}, stats);
//   coordinator.add_handlers(loop.handlers());   // and the other modules
//   loop.bind();
//   return loop.run(coordinator, [&](Clock::time_point now) { checkpointer.tick(now); });
//
// With options.curve the socket is a CURVE server: a ZAP handler
// (server/zap_handler.h) admits only the listed keys, and each request is
// checked by the dispatcher against the rights of its connection's identity
// (server/rights.h); a refusal gets an error reply naming the op
// and the missing right, is counted (PsStats::refused) and logged once per
// peer address and op.
//
// With options.replication a second socket, the replicator's DEALER to the
// backup, is polled beside the ROUTER (server/replicator.h).
//
// Thread rules: the ps is single-threaded and this is where that holds: run()
// reads, dispatches and sends on its caller's thread, one request at a time,
// so handlers need no locks. The other threads are ZeroMQ's I/O thread,
// which merely drops its references to a sent frame's buffer and budget
// claim (atomic counts) once the bytes are on the wire, and under CURVE the
// ZAP handler's, which shares nothing with the loop but the ZeroMQ context.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "server/coordinator.h"
#include "server/dispatcher.h"
#include "server/ps_stats.h"
#include "server/replicator.h"
#include "server/request.h"
#include "server/rights.h"
#include "shared/curve_keys.h"
#include "shared/error.h"
#include "shared/fault.h"

namespace pstrain::ps {

// The socket cannot be bound, or failed while serving; the message says why.
struct NetworkError : pstrain::Error {
  using pstrain::Error::Error;
};

// security.curve: the ps's own key pair, the keys it accepts (each with its
// identity) and what each identity may do.
struct CurveServerOptions {
  CurveKeyPair own;
  std::vector<PublicKey> allowed;
  RightsPolicy rights;
};

struct RequestLoopOptions {
  std::uint32_t ps_index = 0;
  std::uint64_t run_id = 0;       // every request must carry it (ClusterConfig::run_id)
  std::uint64_t config_hash = 0;  // ClusterConfig::hash: a hello of another launch has it
  std::string config_yaml;        // ours, to name the keys a hello's config differs in
  std::string bind_address;       // "tcp://host:port"
  // Stamped on every reply (wire::Header::generation): nonzero, new for
  // every state this ps serves that may differ from what clients saw.
  std::uint64_t generation = 1;
  std::uint32_t io_threads = 1;  // of the loop's ZeroMQ context (net.io_threads)
  FaultConfig fault;             // for tests: off by default
  std::uint64_t fault_seed = 0;
  std::optional<CurveServerOptions> curve;  // none: plain TCP, nobody authenticated
  // replication.replicas 2 (server/replicator.h): where this ps forwards its
  // shard's updates, and whose shard's copy it keeps. (Under CURVE the
  // replicator's key pair is curve->own.)
  std::optional<ReplicatorOptions> replication;
  std::optional<std::uint32_t> replica_of;
};

// The exit code of a ps whose backup took its shard over (run() returns it;
// sysexits' EX_TEMPFAIL): nothing of its own is left to serve, but a new
// process of it re-joins (server/replicator.h), so a launcher restarts it.
inline constexpr int kExitFenced = 75;

class RequestLoop final : public ReplySink {
 public:
  // Installs SIGTERM and SIGINT handlers that make run() return 0; the
  // previous handlers come back when the loop is destroyed.
  RequestLoop(RequestLoopOptions options, PsStats& stats);
  ~RequestLoop() override;
  RequestLoop(const RequestLoop&) = delete;
  RequestLoop& operator=(const RequestLoop&) = delete;

  Handlers& handlers();
  // The handlers of the forwards of ps options.replica_of (Dispatcher).
  Handlers& replica_handlers();
  // Re-join (replication, server/replicator.h): this ps's shard and the copy
  // it keeps, as the ps role holds them.
  void set_shards(ShardAccess own, ShardAccess copy);
  void bind();  // throws NetworkError
  // Tells the coordinator it starts serving, then serves until
  // coordinator.exit_code() is set (returns it) or a stop signal arrives
  // (returns 0). Calls `tick` between batches of requests, at least every
  // 100 ms, like coordinator.tick(); returns kExitFenced when the backup
  // took this ps's shard over (fenced()). Throws NetworkError.
  int run(Coordinator& coordinator, const std::function<void(Clock::time_point)>& tick = {});
  // Whether run() ended because the backup took this ps's shard over
  // (server/replicator.h): nothing this ps holds of its shard is current.
  bool fenced() const;

  // Fills the reply's payload description and run id, and sends it.
  void send(const Peer& to, Reply reply) override;
  void accepted(const wire::Header& request, std::uint64_t version) override;
  void applied_step(const wire::StepRequest& step, std::span<const float> mean,
                    std::span<const Request> contributors) override;
  // Whether this ps serves the copy it keeps (it took its primary's shard
  // over and has not handed it back).
  bool serves_copy() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pstrain::ps
