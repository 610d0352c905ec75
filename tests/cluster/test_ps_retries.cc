// Retries against real `pstrain --role ps` processes: with net.fault.drop
// losing a tenth of the data messages on both sides, integer updates from
// several client processes still end exact (nothing lost, nothing applied
// twice) and the ps's stats show resends answered from its record; a
// stalled ps (SIGSTOP) holding tens of MB of a client's zero-copy frames
// makes every call end within request_timeout plus a margin, never hang; a
// resend on the wire is answered from the record; every reply carries the
// ps's generation, and a restart shows as a change.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>

#include "client/ps/ps_client.h"
#include "tests/support/exact_pushes.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;
using Clock = std::chrono::steady_clock;

namespace {

std::uint64_t stat_sum(PsClient& ps, std::uint32_t servers, const std::string& key) {
  std::uint64_t sum = 0;
  for (std::uint32_t s = 0; s < servers; ++s) sum += stat(ps.stats(s), key);
  return sum;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sends SIGCONT to a stopped ps however the test ends, so that ending it
// by PID (SIGTERM first) works.
struct Resume {
  ChildProcess& ps;
  ~Resume() { ps.kill(SIGCONT); }
};

// A data request of `op` on chunk 0 of "v", as a client that resends
// (incarnation != 0) or a tool that does not (0) sends it.
std::vector<std::vector<std::uint8_t>> chunk_request(const ClusterConfig& config, wire::Op op,
                                                     std::uint64_t id, std::uint64_t incarnation,
                                                     const std::vector<float>& payload = {}) {
  wire::Header h;
  h.op = op;
  h.request_id = id;
  h.incarnation = incarnation;
  h.run_id = config.hash();
  wire::ChunkRequest{"v", 0}.write(h);
  if (payload.empty()) return {wire::encode_header(h)};
  h.payload_frames = 1;
  h.elements = payload.size();
  const auto* p = reinterpret_cast<const std::uint8_t*>(payload.data());
  return {wire::encode_header(h), std::vector<std::uint8_t>(p, p + payload.size() * 4)};
}

std::vector<float> floats(const RawReply& r) {
  std::vector<float> v(r.payload.at(0).size() / 4);
  std::memcpy(v.data(), r.payload[0].data(), v.size() * 4);
  return v;
}

}  // namespace

TEST_CASE("retries: integer updates stay exact with 10% of messages dropped and resent") {
  PsCluster cluster({.ps = 2,
                     .workers = 3,
                     .optimizer = "sgd",
                     .lr = 1,
                     .retry_interval = 0.05,
                     .fault_drop = 0.1});
  cluster.start_all();
  const auto& config = cluster.config();
  check_exact_pushes(config, 3, 150);
  PsClient check(config, kTool, shard_map_for(config, exact_push_variables()));
  // Replies were lost after their updates were applied, and the resends
  // were answered from the record; nothing was refused.
  const auto answered = stat_sum(check, 2, "resends_answered");
  const auto drops = stat_sum(check, 2, "fault_drops");
  MESSAGE("resends answered from the record: ", answered, ", replies dropped: ", drops);
  CHECK(answered > 10);
  CHECK(drops > 10);
  CHECK(stat_sum(check, 2, "requests_too_old") == 0);
  CHECK(stat_sum(check, 2, "errors") == 0);
}

TEST_CASE("retries: a stalled ps with a large model ends every call within request_timeout") {
  constexpr double kTimeout = 3, kMargin = 2;
  PsCluster cluster({.ps = 2,
                     .workers = 2,
                     .chunk_bytes = 4 << 20,
                     .request_timeout = kTimeout,
                     .retry_interval = 0.5});
  cluster.start_all();
  const auto& config = cluster.config();
  // 24 MB of "w" per push_pull each way, in 4 MiB chunks on both servers:
  // far more than loopback buffers hold, so a stopped ps leaves most of a
  // step's zero-copy frames queued in the client.
  constexpr std::size_t kW = 6 << 20;
  const std::vector<VariableSpec> vars = {{"w", kW, {InitKind::uniform, 0.1f}},
                                          {"b", 10, {InitKind::zeros, 0}}};
  const auto map = shard_map_for(config, vars);
  // The ps to stop is the one that does not hold "b": waiting for "b" then
  // succeeds while the stopped ps still holds the frames of "w".
  const auto b_server = map.chunks(*map.find("b"))[0].server;
  const std::uint32_t stalled = 1 - b_server;
  {
    PsClient setup(config, kTool, map);
    setup.hello();
    setup.init(1);
  }

  constexpr std::uint32_t kClients = 2;
  std::vector<std::unique_ptr<ForkedClient>> clients;
  for (std::uint32_t k = 0; k < kClients; ++k) {
    const auto ready = cluster.dir() / ("ready" + std::to_string(k));
    clients.push_back(std::make_unique<ForkedClient>([&, k, ready] {
      PsClient ps(config, k, map);
      ps.hello();
      std::vector<float> gw(kW, 1e-6f), out(kW), gb(10, 1.0f);
      double longest = 0;
      for (int step = 0; step < 100000; ++step) {
        const auto tw = ps.push_pull("w", gw, out);
        const auto tb = ps.push("b", gb);
        try {
          for (const auto t : {tb, tw}) {
            const auto start = Clock::now();
            try {
              ps.wait(t);
            } catch (...) {
              longest = std::max(longest, seconds_since(start));
              throw;
            }
            longest = std::max(longest, seconds_since(start));
          }
        } catch (const PsError& e) {
          std::fprintf(stderr, "client %u: step %d: %s (longest call %.2f s)\n", k, step, e.what(),
                       longest);
          if (longest > kTimeout + kMargin)
            throw std::runtime_error("a call took " + std::to_string(longest) + " s");
          const auto who = "ps " + std::to_string(stalled) + " (";
          if (std::string(e.what()).find(who) == std::string::npos)
            throw std::runtime_error("the error does not name the stalled ps");
          return;
        }
        if (step == 0) std::ofstream(ready) << "stepping\n";
      }
      throw std::runtime_error("never saw the stall");
    }));
  }
  const auto wait_start = Clock::now();
  for (std::uint32_t k = 0; k < kClients; ++k)
    while (!std::filesystem::exists(cluster.dir() / ("ready" + std::to_string(k)))) {
      REQUIRE(seconds_since(wait_start) < 60);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-step somewhere

  auto& ps = cluster.ps(stalled);
  Resume resume{ps};
  ps.kill(SIGSTOP);
  const auto stopped = Clock::now();
  // Each client ends with an error naming the stalled ps, no call longer
  // than request_timeout plus the margin (the clients check that), and all
  // within request_timeout plus the margin of the stop.
  for (auto& c : clients)
    CHECK(c->wait_for(std::chrono::duration<double>(kTimeout + kMargin + 1)) == 0);
  const auto ended = seconds_since(stopped);
  MESSAGE("clients ended ", ended, " s after the SIGSTOP");
  CHECK(ended < kTimeout + kMargin + 1);
}

TEST_CASE("retries: abandon_all gives up on a stalled ps's calls within one deadline") {
  constexpr double kTimeout = 3;
  PsCluster cluster({.ps = 1, .request_timeout = kTimeout, .retry_interval = 0.5});
  cluster.start_all();
  const auto& config = cluster.config();
  // Six variables of 16 MB: more than loopback buffers hold, so the stopped
  // ps leaves zero-copy frames queued in the client.
  constexpr std::size_t kN = 4 << 20;
  std::vector<VariableSpec> vars;
  for (int v = 0; v < 6; ++v) vars.push_back({"v" + std::to_string(v), kN, {InitKind::zeros, 0}});
  PsClient client(config, 0, shard_map_for(config, vars));
  client.hello();
  client.init(1);
  std::vector<std::vector<float>> grads(vars.size(), std::vector<float>(kN, 1.0f));
  Resume resume{cluster.ps(0)};
  cluster.ps(0).kill(SIGSTOP);
  std::vector<PsClient::Ticket> tickets;
  for (std::size_t v = 0; v < vars.size(); ++v)
    tickets.push_back(client.push(vars[v].name, grads[v]));
  // Waiting each out in turn would take six request timeouts (18 s); the
  // frames are released at the first deadline at the latest.
  const auto start = Clock::now();
  client.abandon_all();
  const auto took = seconds_since(start);
  MESSAGE("abandon_all returned after ", took, " s");
  CHECK(took < 2 * kTimeout);
  for (auto t : tickets) CHECK_NOTHROW(client.wait(t));
  // The buffers are the caller's again: poisoned, nothing of them reaches
  // the ps (which would refuse a NaN gradient and count it).
  for (auto& g : grads) std::fill(g.begin(), g.end(), std::nanf(""));
  cluster.ps(0).kill(SIGCONT);
  std::vector<float> out(kN);
  client.wait(client.pull("v0", out));  // the client works on
  CHECK(stat(client.stats(0), "nonfinite_refused") == 0);
  CHECK(stat(client.stats(0), "errors") == 0);
}

TEST_CASE("retries: a resend on the wire is answered from the record, never applied twice") {
  PsCluster cluster({.ps = 1});
  cluster.start_all();
  const auto& config = cluster.config();
  RawPeer peer(config.ps[0].connect_address());
  using wire::Op;
  constexpr std::uint64_t kIncarnation = 77;
  auto exchange = [&](Op op, std::uint64_t id, std::uint64_t incarnation,
                      const std::vector<float>& payload = {}) {
    auto reply = peer.exchange(chunk_request(config, op, id, incarnation, payload));
    REQUIRE(reply);
    REQUIRE_MESSAGE(reply->header.status == wire::Status::ok, reply->header.text);
    CHECK(reply->header.op == op);
    CHECK(reply->header.request_id == id);
    return *reply;
  };
  const auto generation = exchange(Op::init, 1, kIncarnation, {10, 20, 30, 40}).header.generation;
  CHECK(generation != 0);

  CHECK(exchange(Op::push, 2, kIncarnation, {1, 1, 1, 1}).header.version == 1);
  // The resend gets the first reply's version; the push is not applied again.
  CHECK(exchange(Op::push, 2, kIncarnation, {1, 1, 1, 1}).header.version == 1);
  auto pulled = exchange(Op::pull, 3, kIncarnation);
  CHECK(pulled.header.version == 1);
  CHECK(floats(pulled) == std::vector<float>{9, 19, 29, 39});

  // A resent push_pull is answered with the values and version as they are.
  const auto first = exchange(Op::push_pull, 4, kIncarnation, {2, 2, 2, 2});
  const auto again = exchange(Op::push_pull, 4, kIncarnation, {2, 2, 2, 2});
  CHECK(first.header.version == 2);
  CHECK(again.header.version == 2);
  CHECK(floats(first) == std::vector<float>{7, 17, 27, 37});
  CHECK(floats(again) == std::vector<float>{7, 17, 27, 37});

  // Incarnation 0 (a tool that never resends) is not recorded: the same id
  // twice is two updates.
  CHECK(exchange(Op::push, 9, 0, {1, 1, 1, 1}).header.version == 3);
  CHECK(exchange(Op::push, 9, 0, {1, 1, 1, 1}).header.version == 4);

  // Error replies carry the generation too.
  auto wrong = chunk_request(config, Op::pull, 10, kIncarnation);
  auto h = wire::decode_header(wrong[0]);
  h.run_id ^= 1;
  const auto refused = peer.exchange({wire::encode_header(h)});
  REQUIRE(refused);
  CHECK(refused->header.status == wire::Status::error);
  CHECK(refused->header.generation == generation);

  // A tool: the raw peer above held worker index 0.
  PsClient client(config, kTool, shard_map_for(config, {{"v", 4, {InitKind::zeros, 0}}}));
  const auto stats = client.stats(0);
  CHECK(stat(stats, "resends_answered") == 2);
  CHECK(stat(stats, "requests_too_old") == 0);
  CHECK(client.generation(0) == generation);
}

TEST_CASE("retries: every reply carries the ps's generation; a restarted ps shows a new one") {
  PsCluster cluster({.ps = 2, .request_timeout = 10, .retry_interval = 0.2});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient client(config, 0, shard_map_for(config, {{"w", 40000, {InitKind::zeros, 0}}}));
  CHECK(client.generation(0) == 0);  // nothing heard yet
  client.hello();
  const auto g0 = client.generation(0), g1 = client.generation(1);
  CHECK(g0 != 0);
  CHECK(g1 != 0);
  CHECK(g0 != g1);
  // The first generation heard is not a change.
  CHECK_FALSE(client.take_generation_change(0));
  CHECK_FALSE(client.take_generation_change(1));
  client.init(1);
  std::vector<float> w(40000);
  client.wait(client.pull("w", w));
  CHECK_FALSE(client.take_generation_change(1));

  cluster.ps(1).kill();
  REQUIRE(cluster.ps(1).wait_for(std::chrono::seconds(10)).has_value());
  cluster.start_ps(1);
  // The new process has none of the chunks; init creates them (its requests
  // resent until the new ps answers) and its replies carry the new generation.
  client.init(1);
  CHECK(client.generation(1) != g1);
  CHECK(client.generation(1) != 0);
  CHECK(client.take_generation_change(1));
  CHECK_FALSE(client.take_generation_change(1));  // once per change
  CHECK(client.generation(0) == g0);
  CHECK_FALSE(client.take_generation_change(0));
}
