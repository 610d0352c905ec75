#include "shared/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "shared/log.h"

namespace pstrain {
namespace {

// Scrapes come one at a time from each scraper; a second thread keeps a
// stalled client from delaying another scraper by more than its timeout.
constexpr std::size_t kHttpThreads = 2;

}  // namespace

struct MetricsServer::Http {
  httplib::Server server;
  std::atomic<bool> loop_ended{false};  // listen_after_bind() returned
};

MetricsServer::MetricsServer(const MetricsRegistry& registry, const std::string& host,
                             std::uint16_t port)
    : http_(std::make_unique<Http>()) {
  auto& s = http_->server;
  s.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  // cpp-httplib's default also sets SO_REUSEPORT, with which a second
  // process could bind the same port and take half the scrapes. SO_REUSEADDR
  // alone lets a restarted process bind while old connections linger in
  // TIME_WAIT, and still refuses a port someone listens on.
  s.set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.set_read_timeout(kSocketTimeout);
  s.set_write_timeout(kSocketTimeout);
  s.set_keep_alive_max_count(1);
  s.Get("/metrics", [this, &registry](const httplib::Request&, httplib::Response& response) {
    std::uint64_t scrape = 0;
    {
      MutexLock lock(scrapes_mutex_);
      scrape = ++scrapes_begun_;
    }
    response.set_content(registry.prometheus_text(), "text/plain; version=0.0.4; charset=utf-8");
    MutexLock lock(scrapes_mutex_);
    last_answered_ = std::max(last_answered_, scrape);
  });
  errno = 0;
  const int bound = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    const int error = errno;
    throw MetricsServerError("cannot serve metrics on " + host + ":" + std::to_string(port) + ": " +
                             (error ? std::strerror(error) : "the address cannot be resolved"));
  }
  port_ = static_cast<std::uint16_t>(bound);
  thread_ = std::thread([http = http_.get()] {
    http->server.listen_after_bind();
    http->loop_ended = true;
  });
}

MetricsServer::~MetricsServer() {
  // stop() only acts on a running loop: wait until the thread has entered
  // it (or left it at once, failing).
  while (!http_->server.is_running() && !http_->loop_ended)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!http_->loop_ended) http_->server.stop();
  thread_.join();
}

bool MetricsServer::wait_for_scrape(std::chrono::duration<double> timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::uint64_t mark = 0;
  {
    MutexLock lock(scrapes_mutex_);
    mark = scrapes_begun_;
  }
  while (true) {
    {
      MutexLock lock(scrapes_mutex_);
      if (last_answered_ > mark) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string_view to_string(Role role) { return role == Role::ps ? "ps" : "worker"; }

namespace {

// Where a process's endpoint listens: a ps where it binds its socket (ZeroMQ's
// wildcard `*` is 0.0.0.0 to the HTTP server), a worker on its host.
std::string metrics_host(const ClusterConfig& config, Role role, std::uint32_t index) {
  if (role == Role::worker) return config.workers.at(index).host;
  const auto& ps = config.ps.at(index);
  const std::string& bind = ps.bind.empty() ? ps.host : ps.bind;
  return bind == "*" ? "0.0.0.0" : bind;
}

}  // namespace

ProcessMetrics::ProcessMetrics(const ClusterConfig& config, Role role, std::uint32_t index)
    : registry_({{"job", config.job},
                 {"role", std::string(to_string(role))},
                 {"index", std::to_string(index)}}),
      finished_(registry_
                    .gauge("pstrain_finished",
                           "1 once this process's work is over and every series holds its "
                           "final value.")
                    .with()),
      linger_s_(config.metrics.linger_s) {
  if (!config.metrics.enabled) return;
  const auto host = metrics_host(config, role, index);
  const auto port = metrics_port(config, role == Role::ps, index);
  try {
    server_ = std::make_unique<MetricsServer>(registry_, host, port);
  } catch (const MetricsServerError& e) {
    throw MetricsServerError(std::string(e.what()) + " (metrics.port_base " +
                             std::to_string(config.metrics.port_base) + " gives " +
                             std::string(to_string(role)) + " " + std::to_string(index) + " port " +
                             std::to_string(port) + ")");
  }
  log("metrics at http://", host, ":", port, "/metrics");
}

void ProcessMetrics::finish() {
  finished_.set(1);
  if (!server_ || linger_s_ <= 0) return;
  if (server_->wait_for_scrape(std::chrono::duration<double>(linger_s_)))
    log("metrics: a scrape read the final values");
  else
    log("metrics: no scrape read the final values within metrics.linger_s (", linger_s_, " s)");
}

}  // namespace pstrain
