// Concurrent updates from several client processes against 2 real
// `pstrain --role ps` processes: with SGD, lr = 1 and integer gradients every
// update is exact, so the final values must equal initial - sum of all pushes
// bit for bit (no update lost or applied twice). The staleness a client
// reports, from versions the test controls. Also snapshot and restore with
// Adam, whose state makes any difference visible in later updates. And
// net.wire_dtype: 16-bit gradients widened, 16-bit replies rounded, f32 kept.
// Priority order: what a client stamps, and the order a ps serves a queue.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "client/ps/ps_client.h"
#include "shared/gradient_compression.h"
#include "shared/low_precision.h"
#include "shared/optimizer.h"
#include "shared/snapshot.h"
#include "tests/support/exact_pushes.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

std::vector<VariableSpec> variables() {
  // "w" spans many 64 KiB chunks on both servers; "b" is one small chunk.
  return {{"w", 40000, {InitKind::uniform, 1.0f}}, {"b", 10, {InitKind::zeros, 0}}};
}

ShardMap shard_map(const ClusterConfig& c) { return shard_map_for(c, variables()); }

std::vector<float> pull_all(PsClient& ps, const std::string& name, std::size_t n) {
  std::vector<float> v(n);
  ps.wait(ps.pull(name, v));
  return v;
}

}  // namespace

TEST_CASE("ps: 3 client processes pushing concurrently lose no update") {
  PsCluster cluster({.ps = 2, .workers = 3, .optimizer = "sgd", .lr = 1});
  cluster.start_all();
  const auto& config = cluster.config();
  check_exact_pushes(config, 3, 1500);
  PsClient check(config, kTool, shard_map(config));
  for (std::uint32_t s = 0; s < 2; ++s) {
    const auto stats = check.stats(s);
    CHECK(stats.find("\"errors\":0") != std::string::npos);
  }
}

TEST_CASE("ps: staleness counts the updates others applied between a pull and a push") {
  PsCluster cluster({.ps = 2, .workers = 2});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient a(config, 0, shard_map(config)), b(config, 1, shard_map(config));
  a.init(1);
  REQUIRE(shard_map(config).chunks(0).size() > 2);  // "w" spans chunks on both servers
  const std::vector<float> grad(40000, 0.5f);
  std::vector<float> out(40000);
  auto others_push = [&](int n) {
    for (int i = 0; i < n; ++i) b.wait(b.push("w", grad));
  };

  a.wait(a.pull("w", out));
  others_push(3);
  a.wait(a.push_pull("w", grad, out));  // pulled, then 3 other updates, then this one
  CHECK(a.last_staleness("w") == 3);
  others_push(2);
  a.wait(a.push("w", grad));  // 2 since the push_pull's values
  CHECK(a.last_staleness("w") == 2);
  a.wait(a.pull("w", out));
  a.wait(a.push("w", grad));  // nobody in between
  CHECK(a.last_staleness("w") == 0);
  // b never pulled, so all 8 updates so far (5 of its own, 3 of a's) count.
  b.wait(b.push("w", grad));
  CHECK(b.last_staleness("w") == 8);
}

TEST_CASE("ps: a restored snapshot continues bit-identically (adam)") {
  PsCluster cluster({.ps = 2, .workers = 1, .optimizer = "adam", .lr = 0.01});
  cluster.start_all();
  const auto& config = cluster.config();
  auto gradients = [](std::uint32_t step, std::size_t n) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * i + 1.3f * step);
    return g;
  };
  auto push_steps = [&](PsClient& ps, std::uint32_t first, std::uint32_t last) {
    for (std::uint32_t s = first; s < last; ++s) {
      const auto gw = gradients(s, 40000), gb = gradients(s, 10);
      ps.wait(ps.push("w", gw));
      ps.wait(ps.push("b", gb));
    }
  };

  std::vector<float> at_snapshot_w, continued_w, continued_b;
  std::vector<std::string> paths;
  {
    PsClient ps(config, 0, shard_map(config));
    ps.hello();
    ps.init(7);
    push_steps(ps, 0, 5);
    for (std::uint32_t s = 0; s < 2; ++s) paths.push_back(ps.snapshot(s));
    at_snapshot_w = pull_all(ps, "w", 40000);
    push_steps(ps, 5, 10);
    continued_w = pull_all(ps, "w", 40000);
    continued_b = pull_all(ps, "b", 10);
    for (std::uint32_t s = 0; s < 2; ++s) ps.shutdown(s);
  }
  for (std::uint32_t s = 0; s < 2; ++s) {
    CHECK(paths[s] == (cluster.dir() / "snapshot" / ("ps" + std::to_string(s) + ".bin")).string());
    REQUIRE(cluster.ps(s).wait_for(std::chrono::seconds(10)) == 0);
  }

  for (std::uint32_t s = 0; s < 2; ++s)
    cluster.start_ps(s, {"--restore", (cluster.dir() / "snapshot").string()});
  // Every chunk holds the snapshot file's values and version, bit for bit.
  const auto mismatches = restored_mismatches(config, cluster.dir() / "snapshot");
  CHECK_MESSAGE(mismatches.empty(), mismatches);
  PsClient ps(config, 0, shard_map(config));
  ps.hello();
  CHECK(bit_equal(pull_all(ps, "w", 40000), at_snapshot_w));
  push_steps(ps, 5, 10);
  CHECK(bit_equal(pull_all(ps, "w", 40000), continued_w));
  CHECK(bit_equal(pull_all(ps, "b", 10), continued_b));
  // Adam's state matters: the same steps from fresh state give other values.
  CHECK_FALSE(bit_equal(continued_w, at_snapshot_w));
}

TEST_CASE("ps: a damaged snapshot stops the restoring ps with a message naming the file") {
  PsCluster cluster({.ps = 1});
  const auto dir = cluster.dir() / "snapshot";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "ps0.bin") << "PSTRSNAP truncated";
  auto& ps = cluster.start_ps(0, {"--restore", dir.string()});
  const auto code = ps.wait_for(std::chrono::seconds(10));
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(ps.log_text().find((dir / "ps0.bin").string()) != std::string::npos);
}

TEST_CASE("ps: a snapshot written by another number of servers is refused, saying so") {
  PsCluster cluster({.ps = 1});
  const auto dir = cluster.dir() / "snapshot";
  std::filesystem::create_directories(dir);
  write_snapshot(dir / "ps0.bin", {});
  write_snapshot(dir / "ps1.bin", {});
  auto& ps = cluster.start_ps(0, {"--restore", dir.string()});
  const auto code = ps.wait_for(std::chrono::seconds(10));
  REQUIRE(code.has_value());
  CHECK(*code == 2);
  CHECK_MESSAGE(ps.log_text().find("holds 2 ps files, this cluster has 1 parameter servers") !=
                    std::string::npos,
                ps.log_text());
}

TEST_CASE("ps: bf16 and fp16 on the wire round bit-exactly each way; the ps keeps f32") {
  PsCluster cluster({.ps = 2, .workers = 1, .optimizer = "momentum", .lr = 0.05});
  cluster.start_all();
  const auto& config = cluster.config();
  constexpr std::size_t n = 40000;
  PsClient exact(config, 0, shard_map(config));
  exact.hello();
  exact.init(5);
  // The ps's update, replayed here on the values it should have received.
  OptimizerConfig momentum;
  momentum.kind = OptimizerKind::momentum;
  momentum.lr = 0.05f;
  const Optimizer optimizer(momentum);
  std::vector<float> w = pull_all(exact, "w", n), velocity(n, 0.0f);
  std::uint64_t step = 0;
  for (const auto format : {HalfFormat::bf16, HalfFormat::fp16}) {
    CAPTURE(half_format_name(format));
    auto options = client_options(config, 0);
    options.wire_dtype = format == HalfFormat::bf16 ? WireDType::bf16 : WireDType::fp16;
    PsClient half(ps_addresses(config), shard_map(config), config.run_id(), options);
    half.hello();
    // Values with more mantissa bits than 16-bit formats hold, so every
    // gradient is rounded.
    std::vector<float> grad(n), rounded(n), out(n);
    for (std::size_t i = 0; i < n; ++i) {
      grad[i] = std::sin(0.731f * static_cast<float>(i)) * 1.37f;
      rounded[i] = round_to_half(format, grad[i]);
    }
    const auto before = grad;
    half.wait(half.push("w", grad));
    CHECK(bit_equal(grad, before));  // the caller's buffer is not rounded in place
    optimizer.apply(w, rounded, velocity, ++step);
    // The ps holds f32 values: those of the widened gradient, not rounded.
    const auto held = pull_all(exact, "w", n);
    CHECK(bit_equal(held, w));
    std::size_t not_representable = 0;
    for (const float v : held) not_representable += round_to_half(format, v) != v ? 1 : 0;
    CHECK(not_representable > n / 2);
    // A 16-bit pull and push_pull answer the f32 values rounded.
    auto expect_rounded = [&](const std::vector<float>& got) {
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float want = round_to_half(format, w[i]);
        wrong += std::memcmp(&got[i], &want, sizeof(float)) != 0 ? 1 : 0;
      }
      CHECK(wrong == 0);
    };
    half.wait(half.pull("w", out));
    expect_rounded(out);
    half.wait(half.push_pull("w", grad, out));
    optimizer.apply(w, rounded, velocity, ++step);
    expect_rounded(out);
    CHECK(bit_equal(pull_all(exact, "w", n), w));
  }
}

TEST_CASE("ps: compressed pushes are applied decoded, and error feedback loses nothing") {
  // SGD at lr 1 over 2 ps: each push's decoded gradient, replayed here from
  // the same compression, gives the ps's values bit for bit; and what the
  // client still carries is exactly what the ps has not yet seen.
  PsCluster cluster({.ps = 2, .workers = 1, .optimizer = "sgd", .lr = 1});
  cluster.start_all();
  const auto& config = cluster.config();
  constexpr std::size_t n = 40000;
  for (const char* kind : {"topk:0.01", "sign"}) {
    CAPTURE(kind);
    PsClient plain(config, kTool, shard_map(config));
    plain.hello();
    plain.init(5);
    auto options = client_options(config, 0);
    options.compression = parse_compression(kind);
    const ShardMap map = shard_map(config);
    PsClient compressed(ps_addresses(config), map, config.run_id(), options);
    compressed.hello();
    std::vector<float> w = pull_all(plain, "w", n), carried(n, 0.0f), grad(n), out(n);
    std::vector<std::uint8_t> frame;
    std::vector<float> decoded;
    for (int step = 0; step < 4; ++step) {
      for (std::size_t i = 0; i < n; ++i)
        grad[i] = std::sin(0.731f * static_cast<float>(i * (step + 1))) * 1.37f;
      if (step % 2 == 0)
        compressed.wait(compressed.push("w", grad));
      else
        compressed.wait(compressed.push_pull("w", grad, out));
      // The same compression, chunk by chunk, and the ps's SGD step.
      for (const auto& c : map.chunks(*map.find("w"))) {
        const std::span<float> part = std::span<float>(carried).subspan(c.offset, c.count);
        for (std::size_t i = 0; i < c.count; ++i) part[i] += grad[c.offset + i];
        compress(options.compression, part, frame, part);
        decoded.assign(c.count, 0.0f);
        decompress(options.compression.kind, frame, decoded);
        for (std::size_t i = 0; i < c.count; ++i) w[c.offset + i] -= decoded[i];
      }
      CHECK(bit_equal(pull_all(plain, "w", n), w));
      if (step % 2 == 1) CHECK(bit_equal(out, w));  // push_pull's values come back as f32
    }
    // A fraction of float32's bytes went out.
    const auto volume = compressed.push_volume();
    CHECK(volume.float32 == 4 * n * 4);
    if (options.compression.kind == Compression::Kind::topk)
      CHECK(volume.sent <= volume.float32 * 2 / 100 + 4 * 16 * 8);
    else
      CHECK(volume.sent <= volume.float32 / 32 + 4 * 16 * 5);
  }
  PsClient check(config, kTool, shard_map(config));
  for (std::uint32_t s = 0; s < 2; ++s)
    CHECK(check.stats(s).find("\"errors\":0") != std::string::npos);
}

TEST_CASE("ps client: a chunk request's priority is its variable's place, layer 0's first") {
  // A stand-in ps that only reads what the client sends.
  zmq::context_t context;
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::rcvtimeo, 5000);
  const auto address = "tcp://127.0.0.1:" + std::to_string(free_port());
  router.bind(address);
  const ShardMap map({{"dense0/w", 8, {}}, {"dense0/b", 4, {}}, {"dense1/w", 8, {}}}, 1);
  PsClient client({address}, map, 1);
  std::vector<float> w0(8), b0(4), w1(8);
  // Issued last layer first, as backward sends its gradients.
  client.push_pull("dense1/w", w1, w1);
  client.pull("dense0/b", b0);
  client.pull("dense0/w", w0);
  std::vector<std::pair<std::string, std::uint32_t>> seen;
  for (int i = 0; i < 3; ++i) {
    std::vector<zmq::message_t> frames;
    REQUIRE(zmq::recv_multipart(router, std::back_inserter(frames)));
    const auto h = wire::decode_header({frames[1].data<std::uint8_t>(), frames[1].size()});
    seen.emplace_back(h.name, wire::ChunkRequest::read(h).priority);
  }
  const std::vector<std::pair<std::string, std::uint32_t>> expect{
      {"dense1/w", 2}, {"dense0/b", 1}, {"dense0/w", 0}};
  CHECK(seen == expect);
}

TEST_CASE("ps: requests found queued together are served in priority order") {
  // Every reply holds the ps's loop for 400 ms (net.fault.delay_ms), so what
  // is sent meanwhile queues up and is taken off the socket as one batch.
  PsCluster cluster({.ps = 1, .workers = 1, .fault_delay_ms = 400});
  cluster.start_all();
  const auto& config = cluster.config();
  const ShardMap map({{"w", 16, {InitKind::uniform, 1.0f}}}, 1);
  {
    PsClient init(config, kTool, map);
    init.hello();
    init.init(1);
  }
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 10000);
  dealer.connect(config.ps[0].connect_address());
  auto pull = [&](std::uint64_t id, std::uint32_t priority) {
    wire::Header h;
    h.op = wire::Op::pull;
    h.request_id = id;
    h.run_id = config.run_id();
    wire::ChunkRequest{"w", 0, 0, 0, priority}.write(h);
    dealer.send(zmq::buffer(wire::encode_header(h)), zmq::send_flags::none);
  };
  pull(1, 9);  // the ps holds its loop on this one's reply
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  // Request id = the order they should be served in.
  pull(6, 7);
  pull(4, 3);
  pull(2, 0);
  pull(5, 5);
  pull(3, 0);  // equal priorities: arrival order
  std::vector<std::uint64_t> served;
  for (int i = 0; i < 6; ++i) {
    std::vector<zmq::message_t> frames;
    REQUIRE(zmq::recv_multipart(dealer, std::back_inserter(frames)));
    const auto h = wire::decode_header({frames[0].data<std::uint8_t>(), frames[0].size()});
    REQUIRE(h.status == wire::Status::ok);
    served.push_back(h.request_id);
  }
  CHECK(served == std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("ps client: a call's chunks to one ps share messages each way, up to 256 KiB") {
  PsCluster cluster({.ps = 1, .workers = 1, .optimizer = "sgd", .lr = 1});
  cluster.start_all();
  const auto& config = cluster.config();
  // 64 KiB chunks: "w" is 3 of them (160 KB); "big" (2.4 MB) 37, more
  // than a message's 256 KiB.
  const ShardMap map(
      {{"w", 40000, {InitKind::uniform, 1.0f}}, {"big", 600000, {InitKind::zeros, 0}}}, 1,
      config.net.chunk_bytes);
  REQUIRE(map.chunks(0).size() == 3);
  REQUIRE(map.chunks(1).size() == 37);
  PsClient ps(config, kTool, map);
  ps.hello();
  ps.init(1);
  const auto w0 = pull_all(ps, "w", 40000);
  const auto counts = [&] {
    const auto json = ps.stats(0);
    return std::pair{stat(json, "messages"), stat(json, "push_pull")};
  };
  // Integer gradients and lr 1: every value after the push_pulls is exact,
  // and every reply (in messages of several) landed in its own place.
  std::vector<float> grad(40000), out(40000);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 7);
  auto before = counts();
  ps.wait(ps.push_pull("w", grad, out));
  auto after = counts();
  CHECK(after.second - before.second == 3);  // three requests
  CHECK(after.first - before.first == 2);    // in one message, and the stats op's own
  for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == w0[i] - grad[i]);

  std::vector<float> big_grad(600000), big_out(600000);
  for (std::size_t i = 0; i < big_grad.size(); ++i) big_grad[i] = static_cast<float>(i % 5);
  before = counts();
  ps.wait(ps.push_pull("big", big_grad, big_out));
  after = counts();
  CHECK(after.second - before.second == 37);
  // The map cuts "big" into 37 equal chunks of 16216 or 16217 values
  // (about 63.3 KiB): four and their headers fit a message's 256 KiB, five
  // do not: 10 messages.
  CHECK(after.first - before.first == 10 + 1);
  for (std::size_t i = 0; i < big_out.size(); ++i) REQUIRE(big_out[i] == -big_grad[i]);
}
