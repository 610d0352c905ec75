#pragma once
// Where the ps client reads and writes a model's variables on the host, and
// how its requests are kept from outliving those buffers.
#include <cstddef>
#include <span>
#include <vector>

#include "client/compute/backend.h"

namespace pstrain {

class Model;
class PsClient;

// Host views of every variable of a model, for the ps client to pull into
// and push from: the backend's own memory when the host can reach it, else
// pinned staging buffers that the trainer moves with upload and download.
class HostViews {
 public:
  // `grads`: also views of the gradients (the async trainer pushes them).
  HostViews(Backend& backend, Model& model, bool grads);
  bool direct() const { return direct_; }
  std::span<float> weights(std::size_t variable) const { return weights_[variable]; }
  std::span<float> grads(std::size_t variable) const { return grads_.at(variable); }

 private:
  bool direct_;
  std::vector<HostMemory> staging_;
  std::vector<std::span<float>> weights_, grads_;
};

// Keeps a ps client's requests from outliving the buffers they send from
// and receive into (zero-copy: PsClient). When the scope is left by an
// exception (a backend wait that failed, a peer's error) while pushes or
// pulls are in flight, the destructor abandons them (PsDataClient::abandon_all:
// no waiting for replies that may never come, one deadline for ZeroMQ to
// let go of the frames): ZeroMQ then no longer reads the staging buffers
// and no reply is written into them once they are freed. Declare it after
// the buffers, so it runs before they go.
class PsRequestsGuard {
 public:
  explicit PsRequestsGuard(PsClient& ps);
  ~PsRequestsGuard();
  PsRequestsGuard(const PsRequestsGuard&) = delete;
  PsRequestsGuard& operator=(const PsRequestsGuard&) = delete;

 private:
  PsClient& ps_;
  int exceptions_;  // std::uncaught_exceptions() at construction
};

}  // namespace pstrain
