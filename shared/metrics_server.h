#pragma once
// A process's /metrics endpoint: the registry (shared/metrics_registry.h)
// served in Prometheus' text format over HTTP by cpp-httplib, on threads of
// its own.
//
//   ProcessMetrics metrics(config, Role::ps, index);  // serves if metrics.enabled
//   PsStats stats(metrics.registry(), index);           // the role's series
//   ... the role runs ...
//   metrics.finish();  // final values: waits up to metrics.linger_s for a scrape
//
// A scrape never blocks the request loop or a training step: it renders the
// registry, which reads atomics and copies each histogram under that
// histogram's own mutex (a few hundred nanoseconds), concurrently with the
// updates. The roles' threads never wait for the HTTP threads.
//
// Shutdown: the destructor closes the listening socket at once and joins the
// HTTP threads. A response in flight finishes first; the socket timeouts
// (kSocketTimeout, reads and writes alike, one request per connection) bound
// how long a slow or stalled client can hold that up.
//
// Thread rules: the constructor, finish() and the destructor belong to the
// role's main thread; the HTTP threads only render the registry and note
// the scrapes (under scrapes_mutex_).
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "shared/config.h"
#include "shared/error.h"
#include "shared/metrics_registry.h"
#include "shared/thread_annotations.h"

namespace pstrain {

// The endpoint cannot listen (the port is taken, the host has no such
// address); the message names the address.
struct MetricsServerError : pstrain::Error {
  using pstrain::Error::Error;
};

// Serves `registry` at http://host:port/metrics (and nothing else: 404).
class MetricsServer {
 public:
  // The longest a client may take to send its request or read the reply.
  static constexpr std::chrono::seconds kSocketTimeout{1};

  // Listens on host:port (port 0: a free one the kernel picks). Throws
  // MetricsServerError naming host:port when it cannot, a port another
  // socket holds included: the socket does not share ports (no
  // SO_REUSEPORT), so a second process cannot take over a live one's.
  MetricsServer(const MetricsRegistry& registry, const std::string& host, std::uint16_t port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  std::uint16_t port() const { return port_; }
  // Waits until a scrape that began after this call has been answered, at
  // most `timeout`; returns whether one was.
  bool wait_for_scrape(std::chrono::duration<double> timeout);

 private:
  struct Http;  // the cpp-httplib server, kept out of this header
  std::unique_ptr<Http> http_;
  std::uint16_t port_ = 0;
  Mutex scrapes_mutex_;
  std::uint64_t scrapes_begun_ GUARDED_BY(scrapes_mutex_) = 0;
  std::uint64_t last_answered_ GUARDED_BY(scrapes_mutex_) = 0;  // the latest begun, answered
  std::thread thread_;  // runs the accept loop; last, so it starts once all is set
};

enum class Role { ps, worker };
std::string_view to_string(Role role);

// The registry of one ps or worker, its series labelled job, role and index,
// and its endpoint when config.metrics.enabled: on metrics_port() at the
// ps's bind address (or host), or the worker's host. It also holds
// pstrain_finished, 0 until finish().
class ProcessMetrics {
 public:
  // Throws MetricsServerError when the endpoint cannot listen.
  ProcessMetrics(const ClusterConfig& config, Role role, std::uint32_t index);

  MetricsRegistry& registry() { return registry_; }
  bool serving() const { return server_ != nullptr; }
  // The role's work is over and every series holds its final value:
  // pstrain_finished becomes 1, and with metrics.linger_s > 0 the endpoint
  // serves on until a scrape has read that, at most linger_s.
  void finish();

 private:
  MetricsRegistry registry_;
  Gauge& finished_;
  double linger_s_;
  std::unique_ptr<MetricsServer> server_;
};

}  // namespace pstrain
