#pragma once
// All-reduce between CPU workers with Gloo over TCP
// (client/comm/communicator_factory.h picks it for host-accessible backends).
//
// Gloo here (Debian's 2022 build) opens one listening socket per peer on an
// ephemeral port of the worker's own host (workers[i].host in cluster.yaml);
// the addresses travel through ps 0's key-value store (client/comm/rendezvous.h).
// Every operation is bounded by net.request_timeout. When a peer dies
// (Gloo: IoException at once) or hangs (timeout), the survivors hold a roll
// call through the same store and throw CommError naming the workers that did
// not answer; the communicator is unusable after that.
//
// Gloo calls on one context must not overlap: use a communicator from one
// thread at a time.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/comm/communicator.h"
#include "shared/config.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace pstrain {

struct GlooOptions {
  int rank = 0;
  std::vector<std::string> hosts;  // per rank: where it listens, and its name in errors
  std::chrono::milliseconds timeout{30000};
  // How long the survivors of a failure wait for each other's roll-call
  // answers before naming the silent ones.
  std::chrono::milliseconds roll_call{3000};
};

// Rank, hosts and timeout (net.request_timeout) of worker `index`.
GlooOptions gloo_options(const ClusterConfig& config, std::uint32_t index);

class GlooCommunicator : public Communicator {
 public:
  // Connects the full mesh through `store` (shared by every rank's
  // communicator of the run and kept for the roll call). Throws CommError
  // naming the workers that did not join within the timeout.
  GlooCommunicator(GlooOptions options, std::shared_ptr<gloo::rendezvous::Store> store);
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return static_cast<int>(options_.hosts.size()); }
  std::string name() const override { return "gloo"; }

  // Gloo's ring algorithm, bandwidth-optimal for the 0.1-1 MB gradients of
  // these models (bench_allreduce).
  void allreduce_sum(float* data, std::size_t n) override;
  void broadcast(float* data, std::size_t n, int root) override;
  void barrier() override;

 private:
  template <class Op>
  void guarded(const char* what, Op&& op);
  [[noreturn]] void fail(const char* what, const std::string& cause);

  GlooOptions options_;
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<gloo::Context> context_;
  std::string broken_;  // the error that ended the communicator
};

}  // namespace pstrain
