// The /metrics endpoint over real loopback sockets: what a scrape gets, a
// taken port, waiting for a scrape of the final values, and shutdown with
// a client that never sends its request.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <string>
#include <thread>

#include "shared/metrics_server.h"

using namespace pstrain;

namespace {

// A connected TCP socket to 127.0.0.1:port, closed with the handle.
class Connection {
 public:
  explicit Connection(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  }
  ~Connection() { ::close(fd_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends `request` whole and reads until the server closes the connection.
  std::string exchange(const std::string& request) {
    REQUIRE(::send(fd_, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size()));
    std::string response;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd_, buf, sizeof buf, 0)) > 0;) response.append(buf, n);
    return response;
  }

 private:
  int fd_;
};

std::string get(std::uint16_t port, const std::string& path) {
  return Connection(port).exchange("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("metrics server: /metrics answers the registry's text, other paths 404") {
  MetricsRegistry registry(Labels{{"role", "ps"}});
  registry.counter("pstrain_events_total", "Events.").with().add(3);
  MetricsServer server(registry, "127.0.0.1", 0);
  REQUIRE(server.port() != 0);
  const auto response = get(server.port(), "/metrics");
  CHECK(response.starts_with("HTTP/1.1 200 OK\r\n"));
  CHECK(contains(response, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  CHECK(response.ends_with("\r\n\r\n" + registry.prometheus_text()));
  CHECK(contains(response, "pstrain_events_total{role=\"ps\"} 3\n"));
  CHECK(get(server.port(), "/").starts_with("HTTP/1.1 404 "));
}

TEST_CASE("metrics server: a port another socket listens on is refused, naming it") {
  MetricsRegistry registry;
  MetricsServer first(registry, "127.0.0.1", 0);
  const auto port = std::to_string(first.port());
  try {
    MetricsServer second(registry, "127.0.0.1", first.port());
    FAIL("a second server bound port " << port);
  } catch (const MetricsServerError& e) {
    CHECK(std::string(e.what()) ==
          "cannot serve metrics on 127.0.0.1:" + port + ": Address already in use");
  }
  // An address of no interface here (TEST-NET-1): nothing to resolve, bind fails.
  CHECK_THROWS_AS(MetricsServer(registry, "192.0.2.1", 0), MetricsServerError);
}

TEST_CASE("metrics server: waiting for a scrape counts only scrapes begun after the call") {
  MetricsRegistry registry;
  MetricsServer server(registry, "127.0.0.1", 0);
  get(server.port(), "/metrics");  // before: does not count
  CHECK_FALSE(server.wait_for_scrape(std::chrono::milliseconds(50)));
  auto scraper = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return get(server.port(), "/metrics");
  });
  CHECK(server.wait_for_scrape(std::chrono::seconds(30)));
  CHECK(scraper.get().starts_with("HTTP/1.1 200 OK"));
}

TEST_CASE("metrics server: stops with a client connected that never sends its request") {
  MetricsRegistry registry;
  std::optional<Connection> silent;
  {
    MetricsServer server(registry, "127.0.0.1", 0);
    silent.emplace(server.port());
    get(server.port(), "/metrics");  // the accept loop has taken the silent one too
  }  // the destructor returns: the read timeout ends the silent connection
  CHECK(silent->exchange("") == "");  // closed by the server
}

TEST_CASE("process metrics: labelled job, role and index; finish() marks the values final") {
  ClusterConfig config = parse_config(
      "job: j\nps: [{host: 127.0.0.1, port: 7000}]\nworkers: {count: 2}\n", {}, "t.yaml");
  ProcessMetrics metrics(config, Role::worker, 1);
  CHECK_FALSE(metrics.serving());  // metrics.enabled is off by default
  const auto finished = "pstrain_finished{job=\"j\",role=\"worker\",index=\"1\"} ";
  CHECK(contains(metrics.registry().prometheus_text(), finished + std::string("0\n")));
  metrics.finish();
  CHECK(contains(metrics.registry().prometheus_text(), finished + std::string("1\n")));
}
