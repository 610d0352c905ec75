// security.curve against a real `pstrain --role ps`: only listed keys get
// in, the sender is the key's, and each identity has only its rights
// (server/rights.h, docs/security.md).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <zmq.h>

#include "client/ps/ps_client.h"
#include "shared/embedding.h"
#include "shared/messages.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;
using namespace std::chrono_literals;

namespace {

ShardMap small_map(const ClusterConfig& c) { return shard_map_for(c, {{"w", 8, {}}}); }

// A client with `key_of`'s keys (its identity: a worker index, or kTool)
// whose headers claim sender `claims`; short timeouts, for the refusals.
PsClient client_as(const ClusterConfig& config, std::uint32_t key_of, std::uint32_t claims,
                   double timeout_s = 5) {
  auto options = client_options(config, key_of);
  options.sender = claims;
  options.timeout_s = timeout_s;
  return PsClient(ps_addresses(config), small_map(config), config.hash(), options);
}

CurveKeyPair fresh_key_pair() {
  char pub[41], sec[41];
  REQUIRE(zmq_curve_keypair(pub, sec) == 0);
  return {pub, sec};
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("curve: a key not in the list gets no reply and changes nothing") {
  PsCluster cluster({.ps = 1, .workers = 2, .curve = true});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config));
  w0.hello();
  w0.init(1);
  std::vector<float> before(8), after(8);
  w0.wait(w0.pull("w", before));

  // A stranger's key, claiming to be worker 0; and a client without CURVE.
  auto options = client_options(config, 0);
  options.timeout_s = 1.5;
  options.curve->own = fresh_key_pair();
  PsClient stranger(ps_addresses(config), small_map(config), config.hash(), options);
  const std::vector<float> grad(8, 1.0f);
  CHECK_THROWS_WITH_AS(stranger.wait(stranger.push("w", grad)), doctest::Contains("no reply"),
                       PsError);
  CHECK_THROWS_WITH_AS(stranger.shutdown(0), doctest::Contains("no reply"), PsError);
  options.curve.reset();
  PsClient plain(ps_addresses(config), small_map(config), config.hash(), options);
  CHECK_THROWS_WITH_AS(plain.wait(plain.push("w", grad)), doctest::Contains("no reply"), PsError);

  w0.wait(w0.pull("w", after));
  CHECK(std::memcmp(before.data(), after.data(), sizeof(float) * before.size()) == 0);
  PsClient tool(config, kTool, small_map(config));
  const auto stats = tool.stats(0);
  CHECK(stats.find("\"push\":0,") != std::string::npos);
  CHECK(stats.find("\"shutdown\":0,") != std::string::npos);
  CHECK(!cluster.ps(0).wait_for(0s));  // still serving
  CHECK(cluster.ps(0).log_text().find("is not in the public list") != std::string::npos);
}

TEST_CASE("curve: a worker's key cannot shut a ps down, nor act as another worker") {
  PsCluster cluster({.ps = 1, .workers = 2, .curve = true, .tables = "[{name: emb, dim: 2}]"});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config));
  w0.hello();
  w0.init(1);

  PsClient w1(config, 1, small_map(config));
  w1.hello();
  for (int attempt = 0; attempt < 2; ++attempt)
    CHECK_THROWS_WITH_AS(w1.shutdown(0),
                         doctest::Contains("shutdown needs the tool's key; this key is worker:1"),
                         PsError);
  CHECK_THROWS_WITH_AS(w1.snapshot(0), doctest::Contains("snapshot needs"), PsError);
  const std::vector<float> values(8, 5.0f);
  CHECK_THROWS_WITH_AS(w1.wait(w1.assign("w", values)), doctest::Contains("assign needs"), PsError);

  // Worker 1's key, headers claiming worker 0.
  auto forged = client_as(config, 1, 0);
  const std::vector<float> grad(8, 1.0f);
  CHECK_THROWS_WITH_AS(forged.wait(forged.push("w", grad)),
                       doctest::Contains("push claims sender 0; this key is worker:1"), PsError);
  CHECK_THROWS_WITH_AS(forged.barrier("train-done", 2), doctest::Contains("claims sender 0"),
                       PsError);
  CHECK_THROWS_WITH_AS(forged.done(100), doctest::Contains("done claims sender 0"), PsError);
  CHECK_THROWS_WITH_AS(forged.heartbeat(), doctest::Contains("claims sender 0"), PsError);
  // Nor push to an embedding table as another worker.
  const std::vector<std::uint64_t> rows{3, 8};
  const std::vector<float> row_grads(4, 1.0f);
  CHECK_THROWS_WITH_AS(forged.wait(forged.sparse_push("emb", rows, row_grads)),
                       doctest::Contains("sparse_push claims sender 0; this key is worker:1"),
                       PsError);
  // The tool's key cannot pose as a worker either.
  auto tool_as_worker = client_as(config, kTool, 1);
  CHECK_THROWS_WITH_AS(tool_as_worker.done(100), doctest::Contains("this key is tool"), PsError);

  PsClient tool(config, kTool, small_map(config));
  const auto stats = tool.stats(0);
  CHECK(stats.find("\"refused\":10,") != std::string::npos);
  CHECK(stats.find("\"updates\":0,") != std::string::npos);  // nothing was applied
  // The rows the forged push named are still as created.
  std::vector<float> held(4), created(4);
  w0.wait(w0.sparse_pull("emb", rows, held));
  for (std::size_t i = 0; i < rows.size(); ++i)
    init_row({created.data() + 2 * i, 2}, config.train.seed, config.tables[0], rows[i]);
  CHECK(held == created);
  CHECK(!cluster.ps(0).wait_for(200ms));  // no forged done ended it
  const auto log = cluster.ps(0).log_text();
  CHECK(count_of(log, "refused shutdown from") == 1);  // once per peer and op

  // The tool's key may: the ps exits 0.
  tool.shutdown(0);
  CHECK(cluster.ps(0).wait_for(10s) == 0);
}

TEST_CASE("curve: a worker cannot overwrite another worker's kv keys") {
  PsCluster cluster({.ps = 1, .workers = 2, .curve = true});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient w0(config, 0, small_map(config)), w1(config, 1, small_map(config));
  const std::vector<std::uint8_t> mine{1, 2, 3}, theirs{9, 9};
  w0.kv_set("sync/attempt", mine);
  w1.kv_set("sync/attempt", theirs);  // lands in worker 1's own namespace
  CHECK(w1.kv_get(0, "sync/attempt", 0) == mine);
  CHECK(w0.kv_get(1, "sync/attempt", 0) == theirs);

  // A raw kv_set into worker 0's namespace, with worker 1's key and sender.
  const auto dir = cluster.dir() / "keys";
  const auto server = public_key_of(read_public_keys(dir), {Identity::Role::ps, 0}, dir);
  RawPeer raw(config.ps[0].connect_address(),
              std::pair{read_key_pair(dir, {Identity::Role::worker, 1}), server});
  wire::Header h;
  h.op = wire::Op::kv_set;
  h.sender = 1;
  h.request_id = 1;
  h.run_id = config.hash();
  wire::KvSet{wire::kv_key(0, "sync/attempt")}.write(h);
  h.dtype = wire::DType::bytes;
  h.payload_frames = 1;
  h.elements = theirs.size();
  const auto reply = raw.exchange({wire::encode_header(h), theirs});
  REQUIRE(reply);
  CHECK(reply->header.status == wire::Status::error);
  CHECK(wire::ErrorReply::read(reply->header).text.find("outside the key's namespace 'w1/'") !=
        std::string::npos);
  CHECK(w1.kv_get(0, "sync/attempt", 0) == mine);
}
