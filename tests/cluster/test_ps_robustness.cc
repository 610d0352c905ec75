// A live `pstrain --role ps` fed malformed messages through a raw ZeroMQ
// DEALER: every one gets an error reply naming the problem, the ps keeps
// serving, and the stored values stay bit-identical. Memory attacks (a huge
// frame, a peer that never reads, a flood of parked requests) leave the ps
// within a stated bound of its working set, and serving.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "client/ps/ps_client.h"
#include "server/coordinator.h"
#include "shared/messages.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;
using wire::Header;
using wire::Op;

namespace {

// "w": 16 values in one chunk on the one ps.
ShardMap one_chunk_map() { return ShardMap({{"w", 16, {InitKind::uniform, 1.0f}}}, 1); }

// One ps (SGD, lr 1) holding one_chunk_map's "w", a client that
// initialized it, and the values it started from.
struct OneChunkPs {
  PsCluster cluster{{.ps = 1, .workers = 1, .optimizer = "sgd", .lr = 1}};
  ChildProcess& server = cluster.start_ps(0);
  PsClient client{cluster.config(), 0, one_chunk_map()};
  std::vector<float> before = [this] {
    client.hello();
    client.init(3);
    std::vector<float> values(16);
    client.wait(client.pull("w", values));
    return values;
  }();
};

std::vector<std::uint8_t> floats(std::size_t n, float value) {
  std::vector<std::uint8_t> b(n * sizeof(float));
  for (std::size_t i = 0; i < n; ++i) std::memcpy(b.data() + i * 4, &value, 4);
  return b;
}

}  // namespace

TEST_CASE("ps: malformed messages get error replies and change nothing") {
  OneChunkPs ps;
  auto& [cluster, server, client, before] = ps;
  const auto& config = cluster.config();

  // A well-formed push of "w" chunk 0, to be broken in one way at a time.
  Header push;
  push.op = Op::push;
  push.request_id = 4242;
  push.run_id = config.hash();
  wire::ChunkRequest{"w", 0}.write(push);
  push.elements = 16;
  push.payload_frames = 1;
  const auto grad = floats(16, 1.0f);

  RawPeer raw(config.ps[0].connect_address());
  struct Case {
    const char* name;
    std::vector<std::vector<std::uint8_t>> frames;
    const char* expect;  // in the error text
  };
  std::vector<Case> cases;
  const auto good = wire::encode_header(push);
  cases.push_back({"empty header frame", {{}}, "truncated"});
  cases.push_back({"truncated header", {{good.begin(), good.begin() + 9}, grad}, "truncated"});
  {
    std::mt19937 rng(5);
    std::vector<std::uint8_t> garbage(300);
    for (auto& b : garbage) b = static_cast<std::uint8_t>(rng());
    cases.push_back({"garbage", {garbage}, "bad header"});
  }
  cases.push_back({"oversized header frame", {std::vector<std::uint8_t>(70000, 1)}, "limit"});
  {
    auto h = good;
    h[4] = 99;  // the op byte
    cases.push_back({"unknown op", {h, grad}, "unknown op"});
  }
  cases.push_back({"short payload", {good, floats(15, 1.0f)}, "bytes"});
  cases.push_back({"missing payload frame", {good}, "payload frames"});
  cases.push_back({"extra payload frame", {good, grad, grad}, "payload frames"});
  {
    Header h = push;
    wire::ChunkRequest{"nope", 0}.write(h);
    cases.push_back({"unknown variable", {wire::encode_header(h), grad}, "unknown chunk"});
  }
  {
    Header h = push;
    wire::ChunkRequest{"w", 5}.write(h);
    cases.push_back({"unknown chunk", {wire::encode_header(h), grad}, "unknown chunk"});
  }
  {
    Header h = push;
    h.elements = 8;
    cases.push_back({"wrong chunk size", {wire::encode_header(h), floats(8, 1.0f)}, "16"});
  }
  {
    Header h = push;
    h.op = Op::init;
    h.elements = 17;
    cases.push_back(
        {"init with another size", {wire::encode_header(h), floats(17, 0.0f)}, "17 elements"});
  }
  {
    Header h = push;
    h.protocol = wire::kProtocolVersion + 1;
    cases.push_back({"wrong protocol version", {wire::encode_header(h), grad}, "protocol version"});
  }
  {
    Header h;
    h.op = Op::hello;
    h.request_id = 4242;
    h.run_id = config.hash() ^ 1;
    cases.push_back({"wrong run id", {wire::encode_header(h)}, "run id differs"});
  }
  {
    Header h = push;
    h.dtype = wire::DType::bytes;
    h.elements = 64;
    cases.push_back({"push of bytes", {wire::encode_header(h), grad}, "f32"});
  }
  {
    // net.compression's frames (shared/gradient_compression.h), malformed.
    const auto compressed = [&](wire::DType type, std::vector<std::uint8_t> frame,
                                Op op = Op::push) {
      Header h = push;
      h.op = op;
      h.dtype = type;
      h.elements = frame.size();
      return std::vector<std::vector<std::uint8_t>>{wire::encode_header(h), std::move(frame)};
    };
    std::vector<std::uint8_t> three_claimed(4 + 2 * 8, 0);
    three_claimed[0] = 3;
    cases.push_back({"top-k count above what is sent", compressed(wire::DType::topk, three_claimed),
                     "with 3 elements"});
    std::vector<std::uint8_t> beyond(4 + 8, 0);
    beyond[0] = 1;
    beyond[4] = 16;  // index 16 of a chunk of 16
    cases.push_back(
        {"top-k index beyond the chunk", compressed(wire::DType::topk, beyond), "out of range"});
    cases.push_back({"sign frame of the wrong size",
                     compressed(wire::DType::sign, std::vector<std::uint8_t>(5, 0)),
                     "sign frame of 5 bytes for 16 elements"});
    cases.push_back({"assign of a compressed frame",
                     compressed(wire::DType::sign, std::vector<std::uint8_t>(6, 0), Op::assign),
                     "stored exactly"});
  }
  {
    // net.wire_dtype bf16 declared, an f32 gradient sent: its size is checked
    // against the declared dtype.
    Header h = push;
    h.dtype = wire::DType::bf16;
    cases.push_back({"bf16 push with an f32 payload",
                     {wire::encode_header(h), grad},
                     "64 bytes, but the header declares 16 elements (32 bytes)"});
    h.dtype = wire::DType::fp16;
    h.elements = 32;
    cases.push_back({"fp16 push of twice the chunk's values",
                     {wire::encode_header(h), grad},
                     "holds 16 elements, the request carries 32"});
  }
  {
    Header h = push;
    h.op = Op::init;
    h.dtype = wire::DType::bf16;
    cases.push_back({"init in bf16",
                     {wire::encode_header(h), std::vector<std::uint8_t>(32, 0)},
                     "f32 (stored exactly)"});
  }
  {
    Header h = push;
    h.op = Op::pull;
    h.dtype = wire::DType::bytes;
    h.elements = 0;
    h.payload_frames = 0;
    cases.push_back({"pull of bytes", {wire::encode_header(h)}, "travel as f32, bf16 or fp16"});
  }
  {
    Header h;
    h.op = Op::kv_get;
    h.request_id = 4242;
    h.run_id = config.hash();
    wire::KvGet{"k", ~0ULL}.write(h);
    cases.push_back({"kv_get waiting for ages", {wire::encode_header(h)}, "timeout"});
  }

  {
    auto nan = floats(16, 1.0f);
    const float q = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(nan.data() + 7 * 4, &q, 4);
    cases.push_back({"push of a NaN", {good, nan}, "NaN or infinite"});
    Header h = push;
    h.op = Op::assign;
    cases.push_back({"assign of infinities",
                     {wire::encode_header(h), floats(16, std::numeric_limits<float>::infinity())},
                     "NaN or infinite"});
  }

  for (const auto& c : cases) {
    CAPTURE(c.name);
    const auto reply = raw.exchange(c.frames);
    REQUIRE(reply.has_value());
    CHECK(reply->header.status == wire::Status::error);
    CHECK(wire::ErrorReply::read(reply->header).text.find(c.expect) != std::string::npos);
    if (reply->header.request_id != 0) CHECK(reply->header.request_id == 4242);
    CHECK_FALSE(server.wait_for(std::chrono::seconds(0)).has_value());
  }

  // The same well-formed push through the raw socket still works.
  const auto ok = raw.exchange({good, grad});
  REQUIRE(ok.has_value());
  CHECK(ok->header.status == wire::Status::ok);
  CHECK(wire::ChunkReply::read(ok->header).version == 1);

  std::vector<float> after(16);
  client.wait(client.pull("w", after));
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i] == before[i] - 1.0f);

  const auto stats = client.stats(0);
  CHECK(stats.find("\"updates\":1,") != std::string::npos);
  CHECK(stats.find("\"nonfinite_refused\":2,") != std::string::npos);
  CHECK(server.log_text().find("refused a push with NaN or infinite values from sender 0") !=
        std::string::npos);
}

TEST_CASE("ps: a message of several requests gets one message of replies, in order") {
  OneChunkPs ps;
  auto& [cluster, server, client, before] = ps;
  const auto& config = cluster.config();

  const auto request = [&](Op op, std::uint64_t id, const char* variable = "w") {
    Header h;
    h.op = op;
    h.request_id = id;
    h.run_id = config.hash();
    wire::ChunkRequest{variable, 0}.write(h);
    if (op != Op::pull) {
      h.elements = 16;
      h.payload_frames = 1;
    }
    return wire::encode_header(h);
  };
  RawPeer raw(config.ps[0].connect_address());
  // push, pull, a push of an unknown variable, push: applied in order; the
  // bad one gets its own error and the rest go on.
  const auto replies = raw.exchange_all(
      {request(Op::push, 11), floats(16, 1.0f), request(Op::pull, 12),
       request(Op::push, 13, "nope"), floats(16, 1.0f), request(Op::push, 14), floats(16, 2.0f)});
  REQUIRE(replies.size() == 4);
  for (std::uint64_t i = 0; i < 4; ++i) CHECK(replies[i].header.request_id == 11 + i);
  CHECK(replies[0].header.status == wire::Status::ok);
  CHECK(wire::ChunkReply::read(replies[0].header).version == 1);
  REQUIRE(replies[1].header.status == wire::Status::ok);
  REQUIRE(replies[1].payload.size() == 1);
  for (std::size_t i = 0; i < 16; ++i) {
    float v;
    std::memcpy(&v, replies[1].payload[0].data() + i * 4, 4);
    CHECK(v == before[i] - 1.0f);
  }
  CHECK(replies[2].header.status == wire::Status::error);
  CHECK(wire::ErrorReply::read(replies[2].header).text.find("unknown chunk") != std::string::npos);
  CHECK(replies[3].header.status == wire::Status::ok);
  CHECK(wire::ChunkReply::read(replies[3].header).version == 2);

  // Frames that do not cut into requests (a push whose payload is followed
  // by a frame that is no header) are refused whole: nothing is applied.
  const auto refused =
      raw.exchange_all({request(Op::push, 15), floats(16, 1.0f), request(Op::push, 16),
                        floats(16, 1.0f), std::vector<std::uint8_t>(40, 7)});
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].header.request_id == 15);
  CHECK(refused[0].header.status == wire::Status::error);
  CHECK(wire::ErrorReply::read(refused[0].header).text.find("bad header at frame 5") !=
        std::string::npos);

  // At most wire::kMaxRequestsPerMessage requests a message: 256 pulls are
  // answered, 257 (a push among them) refused whole.
  std::vector<std::vector<std::uint8_t>> pulls;
  for (std::uint64_t id = 100; id < 100 + wire::kMaxRequestsPerMessage; ++id)
    pulls.push_back(request(Op::pull, id));
  CHECK(raw.exchange_all(pulls).size() == wire::kMaxRequestsPerMessage);
  pulls.push_back(request(Op::push, 999));
  pulls.push_back(floats(16, 1.0f));
  const auto too_many = raw.exchange_all(pulls);
  REQUIRE(too_many.size() == 1);
  CHECK(too_many[0].header.status == wire::Status::error);
  CHECK(wire::ErrorReply::read(too_many[0].header).text.find("more than 256 requests") !=
        std::string::npos);

  std::vector<float> after(16);
  client.wait(client.pull("w", after));
  for (std::size_t i = 0; i < 16; ++i) CHECK(after[i] == before[i] - 3.0f);
  CHECK(client.stats(0).find("\"updates\":2,") != std::string::npos);
}

namespace {

// A figure of /proc/<pid>/status in kB (VmHWM: the peak resident set).
// The ps under test is built like this test: with AddressSanitizer or
// ThreadSanitizer in those stages of tools/test.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif

std::uint64_t status_kb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(field + ":")) return std::stoull(line.substr(field.size() + 1));
  throw std::runtime_error("no " + field + " for PID " + std::to_string(pid));
}

}  // namespace

TEST_CASE("ps: a frame larger than any legal message is dropped before it is held") {
  PsCluster cluster({.ps = 1, .workers = 1});
  auto& server = cluster.start_ps(0);
  const auto& config = cluster.config();
  PsClient client(config, 0, one_chunk_map());
  client.hello();
  client.init(3);
  const auto peak_before = status_kb(server.pid(), "VmHWM");

  // 256 MiB in one frame: without ZMQ_MAXMSGSIZE the ps would receive all
  // of it before its decoder could refuse it.
  {
    zmq::context_t context;
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 3000);
    socket.connect(config.ps[0].connect_address());
    std::vector<std::uint8_t> huge(256u << 20, 7);
    socket.send(zmq::buffer(huge), zmq::send_flags::none);
  }  // the context waits up to the linger for the frame to go out
  const auto peak_after = status_kb(server.pid(), "VmHWM");
  MESSAGE("ps peak resident set: ", peak_before / 1024, " MB before, ", peak_after / 1024,
          " MB after");
  CHECK(peak_after < peak_before + 64 * 1024);

  // It serves on.
  std::vector<float> w(16);
  client.wait(client.pull("w", w));
  CHECK_FALSE(server.wait_for(std::chrono::seconds(0)).has_value());
}

TEST_CASE("ps: a client with another config is refused, naming the keys that differ, not values") {
  PsCluster cluster({.ps = 1});
  auto& server = cluster.start_ps(0);
  const auto& config = cluster.config();
  const ShardMap map({{"w", 4, {}}}, 1);
  ClusterConfig other = config;
  other.optimizer.lr = 0.5f;
  other.train.batch_size = 32;
  other.run_dir = "/elsewhere/other-run";
  PsClient wrong(other, 0, map);
  try {
    wrong.hello();
    FAIL("hello with another config was accepted");
  } catch (const PsError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("config differs in: run_dir, optimizer.lr, train.batch_size") !=
                      std::string::npos,
                  what);
    // Nothing of the ps's config or run id reaches a peer that is not of
    // the run: not its run directory, not any value.
    CHECK_MESSAGE(what.find(config.run_dir.string()) == std::string::npos, what);
    CHECK_MESSAGE(what.find(" vs ") == std::string::npos, what);
    CHECK_MESSAGE(what.find("0x") == std::string::npos, what);
  }
  // The ps's own log names the values.
  const auto log = server.log_text();
  CHECK_MESSAGE(log.find("optimizer.lr: 1 vs 0.5") != std::string::npos, log);
  CHECK_MESSAGE(log.find("run_dir: " + config.run_dir.string() + " vs /elsewhere/other-run") !=
                    std::string::npos,
                log);
  PsClient right(config, 0, map);
  CHECK_NOTHROW(right.hello());
  // Errors name the ps, its address, the op and the variable.
  std::vector<float> out(4);
  CHECK_THROWS_WITH_AS(
      right.wait(right.pull("w", out)),
      doctest::Contains(
          ("ps 0 (" + config.ps[0].connect_address() + "): pull of 'w' failed").c_str()),
      PsError);
}

TEST_CASE("ps: a silent ps is reported by index, address, op and variable") {
  const auto port = free_port();  // nobody listens here
  const ShardMap map({{"w", 4, {}}}, 1);
  const std::string address = "tcp://127.0.0.1:" + std::to_string(port);
  PsClientOptions options;
  options.timeout_s = 0.3;
  PsClient client({address}, map, 1, options);
  std::vector<float> grad(4, 1.0f);
  CHECK_THROWS_WITH_AS(
      client.wait(client.push("w", grad)),
      doctest::Contains(("ps 0 (" + address + "): no reply to push of 'w'").c_str()), PsError);
}

namespace {

// A client that sends requests of its own making and reads replies only when
// told: its receive queue is kept to one message, so that what the ps sends
// it stays queued on the ps's side, as with a peer that never reads.
class DeafPeer {
 public:
  static constexpr std::uint32_t kSender = 7;  // not a worker

  explicit DeafPeer(const ClusterConfig& config) : run_id_(config.hash()) {
    socket_.set(zmq::sockopt::rcvhwm, 1);
    socket_.set(zmq::sockopt::rcvbuf, 4096);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, 5000);
    socket_.connect(config.ps[0].connect_address());
  }

  void kv_set(const std::string& key, const std::vector<std::uint8_t>& value) {
    Header h = header(Op::kv_set);
    wire::KvSet{wire::kv_key(kSender, key)}.write(h);  // in its own namespace, as PsClient
    h.dtype = wire::DType::bytes;
    h.elements = value.size();
    h.payload_frames = 1;
    socket_.send(zmq::buffer(wire::encode_header(h)), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(value), zmq::send_flags::none);
  }
  void kv_get(const std::string& key, std::uint64_t timeout_ms) {
    Header h = header(Op::kv_get);
    wire::KvGet{wire::kv_key(kSender, key), timeout_ms}.write(h);  // its own keys
    socket_.send(zmq::buffer(wire::encode_header(h)), zmq::send_flags::none);
  }
  void barrier(const std::string& name, std::uint64_t count) {
    Header h = header(Op::barrier);
    wire::Barrier{name, count}.write(h);
    socket_.send(zmq::buffer(wire::encode_header(h)), zmq::send_flags::none);
  }
  // The next reply's header, or nullopt after the receive timeout.
  std::optional<Header> read() {
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(socket_, std::back_inserter(reply))) return std::nullopt;
    return wire::decode_header({reply[0].data<std::uint8_t>(), reply[0].size()});
  }

 private:
  Header header(Op op) {
    Header h;
    h.op = op;
    h.sender = kSender;
    h.request_id = ++request_id_;
    h.run_id = run_id_;
    return h;
  }

  std::uint64_t run_id_;
  std::uint64_t request_id_ = 0;
  zmq::context_t context_;
  zmq::socket_t socket_{context_, zmq::socket_type::dealer};
};

// Waits until the ps has counted `n` requests of `op` (they come over
// another connection than the stats, so in no set order with it).
void wait_for_requests(PsClient& client, const std::string& op, std::uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (stat(client.stats(0), op) < n) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

TEST_CASE("ps: a peer that never reads its replies cannot queue more than its send budget") {
  PsCluster cluster({.ps = 1, .workers = 1});
  auto& server = cluster.start_ps(0);
  const auto& config = cluster.config();
  PsClient client(config, 0, one_chunk_map());
  client.hello();
  client.init(3);

  // The attack of the issue: one large value, then many kv_gets of it; and
  // one that shares nothing: a new value each round, with a kv_get of it,
  // each reply holding its own value. Unbounded, the ps would hold 60 copies
  // and then every round's value: about 1.4 GB. The bound is counted from
  // the ps holding the values (its working set).
  DeafPeer deaf(config);
  const std::vector<std::uint8_t> value(16u << 20, 5);
  const std::vector<std::uint8_t> round(8u << 20, 6);
  deaf.kv_set("big", value);
  deaf.kv_set("round", round);
  wait_for_requests(client, "kv_set", 2);
  const auto peak_before = status_kb(server.pid(), "VmHWM");
  for (int i = 0; i < 60; ++i) deaf.kv_get("big", 0);
  for (int i = 0; i < 60; ++i) {
    deaf.kv_set("round", round);
    deaf.kv_get("round", 0);
  }
  // Others are served meanwhile, large replies included.
  CHECK(client.kv_get(DeafPeer::kSender, "big", 10) == value);
  wait_for_requests(client, "kv_get", 121);

  const auto peak_after = status_kb(server.pid(), "VmHWM");
  MESSAGE("ps peak resident set: ", peak_before / 1024, " MB before, ", peak_after / 1024,
          " MB after the never-reading peer");
  // Under a sanitizer the ps's freed values stay in its allocator's
  // quarantine (ASan: 256 MB by default; TSan delays reuse too), so resident
  // memory says nothing about what the ps holds there: 535 MB under ASan and
  // 695 MB under TSan with the budget working. The drops below still show
  // the budget at work.
  if (!kSanitizedBuild) CHECK(peak_after < peak_before + 100 * 1024);
  const auto stats = client.stats(0);
  CHECK(stat(stats, "replies_dropped") > 0);
  CHECK(server.log_text().find("dropped a kv_get reply to peer 0x") != std::string::npos);
  CHECK(server.log_text().find("(address 127.0.0.1)") != std::string::npos);
  CHECK(client.kv_get(DeafPeer::kSender, "round", 10) == round);
  CHECK_FALSE(server.wait_for(std::chrono::seconds(0)).has_value());
}

TEST_CASE("ps: one peer cannot park more than its share of barrier entries and kv_gets") {
  PsCluster cluster({.ps = 1, .workers = 1});
  auto& server = cluster.start_ps(0);
  const auto& config = cluster.config();
  PsClient client(config, 0, one_chunk_map());
  client.hello();
  const auto peak_before = status_kb(server.pid(), "VmHWM");

  // Parks that would last a day, and barrier entries no one completes.
  constexpr std::size_t kRequests = 20'000;
  DeafPeer flood(config);
  for (std::size_t i = 0; i < kRequests; ++i) {
    if (i % 2)
      flood.kv_get("never " + std::to_string(i), 86'400'000);
    else
      flood.barrier("never", 1'000'000);
  }
  wait_for_requests(client, "barrier", kRequests / 2);
  wait_for_requests(client, "kv_get", kRequests / 2);
  const auto stats = client.stats(0);
  const auto parked = stat(stats, "parked_kv_get") + stat(stats, "parked_barrier");
  MESSAGE("parked after ", kRequests, " requests of one peer: ", parked, "; ps peak resident set ",
          peak_before / 1024, " MB before, ", status_kb(server.pid(), "VmHWM") / 1024, " MB after");
  CHECK(parked == ps::Coordinator::kMaxParkedPerPeer);
  // The rest were refused, naming the limit.
  std::size_t refused = 0;
  while (const auto reply = flood.read()) {
    if (reply->status != wire::Status::error) continue;
    ++refused;
    CHECK(wire::ErrorReply::read(*reply).text.find("the limit per peer") != std::string::npos);
    if (refused == kRequests - parked) break;
  }
  CHECK(refused == kRequests - parked);
  // Not under ThreadSanitizer, whose allocator delays reuse (as above): on
  // a busy 2-core host the refused requests' replies, queued until the
  // flood reads them, took the ps from 28 to 175 MB there, before the
  // metrics endpoint existed as after. The parked count above is the bound.
#if !defined(__SANITIZE_THREAD__)
  CHECK(status_kb(server.pid(), "VmHWM") < peak_before + 100 * 1024);
#endif

  // Others still park and are answered.
  std::vector<std::uint8_t> got;
  std::thread waiter([&] { got = client.kv_get(kTool, "later", 10); });
  PsClient setter(config, kTool, one_chunk_map());
  wait_for_requests(setter, "kv_get", kRequests / 2 + 1);
  setter.kv_set("later", std::vector<std::uint8_t>{1, 2, 3});
  waiter.join();
  CHECK(got == std::vector<std::uint8_t>{1, 2, 3});
  CHECK_FALSE(server.wait_for(std::chrono::seconds(0)).has_value());
}

TEST_CASE(
    "ps: a process of another launch of the same config is refused as stale, changing nothing") {
  PsCluster cluster({.ps = 1, .workers = 1});
  ClusterConfig launch = cluster.config();
  launch.launch_nonce = 0x5eed;
  auto& server = cluster.start_ps(0, {"--run-id", "5eed"});
  PsClient client(launch, 0, one_chunk_map());
  client.hello();
  client.init(3);
  std::vector<float> before(16);
  client.wait(client.pull("w", before));

  // A process of an earlier launch of the same file (its own nonce), and
  // one started by hand without any: both are refused, as stale.
  for (const std::uint64_t nonce : {std::uint64_t{0x01d}, std::uint64_t{0}}) {
    CAPTURE(nonce);
    ClusterConfig earlier = cluster.config();
    earlier.launch_nonce = nonce;
    PsClient stale(earlier, 0, one_chunk_map());
    try {
      stale.hello();
      FAIL("a hello of another launch was accepted");
    } catch (const PsError& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find("a process of another launch of this config") != std::string::npos,
                    what);
      CHECK_MESSAGE(what.find("0x") == std::string::npos, what);  // no run id
    }
    const std::vector<float> grad(16, 1.0f);
    CHECK_THROWS_WITH_AS(stale.wait(stale.push("w", grad)), doctest::Contains("run id differs"),
                         PsError);
  }
  std::vector<float> after(16);
  client.wait(client.pull("w", after));
  CHECK(after == before);
  const auto log = server.log_text();
  CHECK_MESSAGE(log.find("same config, run id") != std::string::npos, log);
}
