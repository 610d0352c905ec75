// The replicator (server/replicator.h) against a backup played by this
// test: a ROUTER socket on loopback that answers what the test says, when it
// says so.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "server/replicator.h"
#include "shared/messages.h"
#include "shared/metrics_registry.h"
#include "tests/support/recording_sink.h"

using namespace pstrain;
using namespace pstrain::ps;
using wire::Op;

namespace {

// What the backup received, by (incarnation, request id): the requests'
// headers and where their answers go.
struct FakeBackup {
  explicit FakeBackup(zmq::context_t& context) : socket(context, zmq::socket_type::router) {
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("tcp://127.0.0.1:*");
    address = socket.get(zmq::sockopt::last_endpoint);
  }
  // Reads what arrived within `wait`.
  void read(std::chrono::milliseconds wait) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    while (zmq::poll(&item, 1, wait) > 0) {
      std::vector<zmq::message_t> frames;
      REQUIRE(zmq::recv_multipart(socket, std::back_inserter(frames)));
      peer = frames[0].to_string();
      const auto h = wire::decode_header({frames[1].data<std::uint8_t>(), frames[1].size()});
      if (h.op != Op::heartbeat) got[{h.incarnation, h.request_id}] = h;
      wait = std::chrono::milliseconds(0);
    }
  }
  void answer(const wire::Header& request) {
    const auto reply = wire::encode_header(wire::reply_to(request));
    socket.send(zmq::buffer(peer), zmq::send_flags::sndmore);
    socket.send(zmq::buffer(reply), zmq::send_flags::none);
  }
  zmq::socket_t socket;
  std::string address, peer;
  std::map<std::pair<std::uint64_t, std::uint64_t>, wire::Header> got;
};

Request push(std::uint64_t incarnation) {
  Request r;
  r.from = "worker " + std::to_string(incarnation);
  r.header.op = Op::push;
  r.header.incarnation = incarnation;
  r.header.request_id = 1;
  wire::ChunkRequest{"w", 0}.write(r.header);
  return r;
}

}  // namespace

TEST_CASE("replicator: a step's replies wait for the backup's answer to the step") {
  zmq::context_t context;
  FakeBackup backup(context);
  MetricsRegistry registry;
  PsStats stats(registry, 0);
  RecordingSink sink;
  Replicator replicator(context,
                        {.ps_index = 0,
                         .run_id = 0,
                         .backup_index = 1,
                         .backup_address = backup.address,
                         .curve = std::nullopt,
                         .retry_interval = std::chrono::milliseconds(50),
                         .backup_silence = std::chrono::seconds(60)},
                        stats, sink);
  // Two gradients of one step, forwarded and accepted with their replies
  // held for later (mode backup), then the step the primary applied.
  const Request a = push(5), b = push(6);
  for (const auto& r : {a, b}) {
    const auto header = wire::encode_header(r.header);
    const std::vector<std::span<const std::uint8_t>> frames = {header};
    replicator.forward(frames, r.header);
    replicator.defer(r.header);
  }
  const std::vector<float> mean(4, 3.0f);
  replicator.forward_step({"w", 0, 0, 2}, mean, std::vector<Request>{a, b});
  for (const auto& r : {a, b}) {
    Reply reply{wire::reply_to(r.header), {}};
    REQUIRE(replicator.hold(r.header, r.from, reply, /*deferred_only=*/true));
  }
  // Until the connection is up, forwards go out again at their resends.
  for (int i = 0; i < 200 && backup.got.size() < 3; ++i) {
    replicator.tick(Clock::now());
    backup.read(std::chrono::milliseconds(10));
  }
  REQUIRE(backup.got.size() == 3);
  wire::Header step;
  for (const auto& [key, h] : backup.got)
    if (h.op == Op::step) step = h;
  REQUIRE(step.op == Op::step);
  CHECK(wire::StepRequest::read(step).gradients == 2);
  // The gradients' forwards answered, the step's not: no reply leaves.
  backup.answer(a.header);
  backup.answer(b.header);
  const auto acked = [&](int n) {
    return registry.prometheus_text().find("pstrain_ps_replication_lag_seconds_count " +
                                           std::to_string(n)) != std::string::npos;
  };
  for (int i = 0; i < 400 && !acked(2); ++i) {
    replicator.receive(Clock::now());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(acked(2));  // both answers read
  CHECK(sink.sent.empty());
  // The step answered: both replies go, each to its worker.
  backup.answer(step);
  for (int i = 0; i < 200 && sink.sent.size() < 2; ++i) {
    replicator.receive(Clock::now());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(sink.sent.size() == 2);
  CHECK(sink.sent[0].to != sink.sent[1].to);
}
