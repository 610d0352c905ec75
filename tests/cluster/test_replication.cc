// Replicated shards (replication.replicas: 2, server/replicator.h) against
// real `pstrain --role ps` processes: with a tenth of the messages dropped,
// the exactness workload ends exact on the primaries, and every ps's copy of
// the shard before it in the ring holds the same bits and versions as that
// shard's primary; under CURVE the forwards are admitted (no backup given
// up).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <thread>

#include "client/ps/ps_client.h"
#include "server/replicator.h"
#include "server/request_loop.h"
#include "shared/embedding.h"
#include "tests/support/exact_pushes.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;

namespace {

// Pulls chunk `index` of `name` through `peer`: its values' bytes and version.
std::optional<std::pair<std::vector<std::uint8_t>, std::uint64_t>> pull(RawPeer& peer,
                                                                        const ClusterConfig& config,
                                                                        const std::string& name,
                                                                        std::uint32_t index) {
  wire::Header h;
  h.op = wire::Op::pull;
  h.request_id = 1;
  h.run_id = config.hash();
  wire::ChunkRequest{name, index}.write(h);
  // net.fault.drop loses replies to this peer too: asked again, as a
  // client would (a pull changes nothing).
  for (int attempt = 0; attempt < 8; ++attempt) {
    const auto reply = peer.exchange({wire::encode_header(h)});
    if (!reply) continue;
    if (reply->header.status != wire::Status::ok || reply->payload.size() != 1) break;
    return std::pair{reply->payload[0], wire::ChunkReply::read(reply->header).version};
  }
  return std::nullopt;
}

// Every chunk of every ps's shard, as its primary and its backup's copy
// hold it: what differs (empty: the copies are bit-equal, versions too).
std::string copy_mismatches(const ClusterConfig& config,
                            const std::vector<VariableSpec>& variables = exact_push_variables()) {
  const auto map = shard_map_for(config, variables);
  const auto servers = static_cast<std::uint32_t>(config.ps.size());
  std::string out;
  std::size_t compared = 0;
  for (std::uint32_t p = 0; p < servers; ++p) {
    const std::uint32_t b = (p + 1) % servers;
    RawPeer primary(config.ps[p].connect_address());
    RawPeer copy(config.ps[b].connect_address(), std::nullopt, ps::Replicator::peer_of(p));
    for (const auto& c : map.all_chunks()) {
      if (c.server != p) continue;
      const auto& name = map.variables()[c.variable].name;
      const std::string what = "'" + name + "' chunk " + std::to_string(c.index) + " of ps " +
                               std::to_string(p) + " (copy on ps " + std::to_string(b) + ")";
      const auto a = pull(primary, config, name, c.index);
      const auto z = pull(copy, config, name, c.index);
      if (!a || !z) {
        out += what + ": not held; ";
        continue;
      }
      if (a->first != z->first) out += what + ": values differ; ";
      if (a->second != z->second)
        out += what + ": version " + std::to_string(a->second) + " against " +
               std::to_string(z->second) + "; ";
      ++compared;
    }
  }
  if (compared == 0) out += "no chunk compared";
  return out;
}

// The table of the tables test: rows of 4, SGD at lr 1 (integer
// gradients keep every value exact).
constexpr std::uint32_t kDim = 4;

std::vector<std::uint64_t> table_keys() {
  std::vector<std::uint64_t> keys;
  for (std::uint64_t i = 0; i < 300; ++i) keys.push_back(i * 7919 + (i << 40));
  std::ranges::sort(keys);
  return keys;
}

// Whether client k's round r touches key i, and its gradient's element j
// there: an integer in [-3, 3].
bool touches(std::uint32_t k, std::uint32_t r, std::size_t i) {
  return (k * 13 + r * 7 + i * 3) % 5 < 2;
}
float row_grad(std::uint32_t k, std::uint32_t r, std::size_t i, std::uint32_t j) {
  return static_cast<float>((k * 5 + r * 3 + i + j) % 7) - 3.0f;
}

// Rows of `keys` homed on ps `p`, as `peer` answers a sparse_pull for them
// (bytes); none when it does not answer.
std::optional<std::vector<std::uint8_t>> pull_rows(RawPeer& peer, const ClusterConfig& config,
                                                   const std::vector<std::uint64_t>& keys) {
  wire::Header h;
  h.op = wire::Op::sparse_pull;
  h.request_id = 1;
  h.run_id = config.hash();
  h.dtype = wire::DType::f32;
  h.payload_frames = 1;
  h.elements = keys.size();
  wire::SparseRequest{"emb", kDim}.write(h);
  std::vector<std::uint8_t> ids(keys.size() * sizeof(std::uint64_t));
  std::memcpy(ids.data(), keys.data(), ids.size());
  for (int attempt = 0; attempt < 8; ++attempt) {
    const auto reply = peer.exchange({wire::encode_header(h), ids});
    if (!reply) continue;
    if (reply->header.status != wire::Status::ok || reply->payload.size() != 1) break;
    return reply->payload[0];
  }
  return std::nullopt;
}

// Every ps's rows, as its primary and its backup's copy hold them: what
// differs (empty: bit-equal, optimizer state aside).
std::string row_copy_mismatches(const ClusterConfig& config,
                                const std::vector<std::uint64_t>& keys) {
  const auto servers = static_cast<std::uint32_t>(config.ps.size());
  std::string out;
  for (std::uint32_t p = 0; p < servers; ++p) {
    std::vector<std::uint64_t> here;
    for (const auto key : keys)
      if (row_home(key, servers, config.train.seed) == p) here.push_back(key);
    const std::uint32_t b = (p + 1) % servers;
    RawPeer primary(config.ps[p].connect_address());
    RawPeer copy(config.ps[b].connect_address(), std::nullopt, ps::Replicator::peer_of(p));
    const auto a = pull_rows(primary, config, here);
    const auto z = pull_rows(copy, config, here);
    const std::string what = "ps " + std::to_string(p) + "'s " + std::to_string(here.size()) +
                             " rows (copy on ps " + std::to_string(b) + ")";
    if (!a || !z)
      out += what + ": not answered; ";
    else if (*a != *z)
      out += what + ": values differ; ";
  }
  return out;
}

// Polls `ready` until it holds or `timeout` passes.
bool eventually(const std::function<bool()>& ready, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// Three ps with replicas 2 and a short backup_silence, for `workers`
// clients of the exactness workload, a `drop` fraction of messages lost.
ClusterSpec failover_spec(std::uint32_t workers, double drop) {
  return {.ps = 3,
          .workers = workers,
          .optimizer = "sgd",
          .lr = 1,
          .retry_interval = 0.05,
          .fault_drop = drop,
          .replication = "{replicas: 2, backup_silence: 1}"};
}

// Until ps `server` has served 100 pushes: the run is well under way.
void wait_for_pushes(PsClient& watch, std::uint32_t server) {
  REQUIRE(eventually([&] { return stat(watch.stats(server), "push") >= 100; },
                     std::chrono::seconds(60)));
}

// ps 1 killed (kill -9), its shard taken over by its backup ps 2, then
// started again without its state, as a launcher would, until ps 2 has
// handed the shard back: a re-join while the clients push on.
void kill_and_rejoin_ps1(PsCluster& cluster, PsClient& watch) {
  cluster.ps(1).kill(SIGKILL);
  REQUIRE(cluster.ps(1).wait_for(std::chrono::seconds(10)));
  REQUIRE(
      eventually([&] { return stat(watch.stats(2), "takeovers") == 1; }, std::chrono::seconds(30)));
  cluster.start_ps(1);
  REQUIRE(
      eventually([&] { return stat(watch.stats(2), "handbacks") == 1; }, std::chrono::seconds(30)));
}

// A request of `op` for chunk 0 of "w" held by ps `server`, as a tool
// speaking the wire by hand sends it (incarnation 0).
std::vector<std::uint8_t> chunk_request(const ClusterConfig& config, wire::Op op,
                                        std::uint32_t server, std::uint32_t elements) {
  const auto map = shard_map_for(config, exact_push_variables());
  for (const auto& c : map.all_chunks()) {
    if (c.server != server || map.variables()[c.variable].name != "w") continue;
    wire::Header h;
    h.op = op;
    h.request_id = 7;
    h.run_id = config.hash();
    wire::ChunkRequest{"w", c.index}.write(h);
    if (op == wire::Op::push) {
      h.dtype = wire::DType::f32;
      h.payload_frames = 1;
      h.elements = elements == 0 ? c.count : elements;
    }
    return wire::encode_header(h);
  }
  throw std::runtime_error("ps " + std::to_string(server) + " holds no chunk of w");
}

void check_forwarded(PsClient& ps, std::uint32_t servers, std::uint64_t at_least) {
  for (std::uint32_t s = 0; s < servers; ++s) {
    const auto json = ps.stats(s);
    CAPTURE(json);
    CHECK(stat(json, "replica_forwards") >= at_least);
    CHECK(stat(json, "backup_losses") == 0);
    CHECK(stat(json, "replication_pending") == 0);
    CHECK(stat(json, "errors") == 0);
  }
}

}  // namespace

TEST_CASE("replication: every acknowledged update is on the backup, bit for bit") {
  PsCluster cluster({.ps = 3,
                     .workers = 3,
                     .optimizer = "sgd",
                     .lr = 1,
                     .retry_interval = 0.05,
                     .fault_drop = 0.1,
                     .replication = "{replicas: 2, backup_silence: 5}"});
  cluster.start_all();
  const auto& config = cluster.config();
  check_exact_pushes(config, 3, 60);
  PsClient check(config, kTool, shard_map_for(config, exact_push_variables()));
  check_forwarded(check, 3, 100);
  CHECK(copy_mismatches(config) == "");
}

TEST_CASE("replication: under CURVE a primary's forwards are admitted by its backup") {
  PsCluster cluster(
      {.ps = 2, .workers = 1, .curve = true, .replication = "{replicas: 2, backup_silence: 5}"});
  cluster.start_all();
  const auto& config = cluster.config();
  const auto map = shard_map_for(config, exact_push_variables());
  PsClient worker(config, 0, map);
  worker.hello();
  worker.init(1);
  std::vector<float> grad(40000, 1.0f), bias(10, 1.0f);
  for (int step = 0; step < 5; ++step) {
    worker.wait(worker.push("w", grad));
    worker.wait(worker.push("b", bias));
  }
  // Every chunk's init and five pushes, on both ps.
  check_forwarded(worker, 2, 6);
}

TEST_CASE("fail-over: a primary killed mid-run loses no acknowledged update") {
  PsCluster cluster(failover_spec(3, 0.1));
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient watch(config, kTool, shard_map_for(config, exact_push_variables()));
  // The clients' updates of ps 1's shard were acknowledged by ps 1 (and its
  // backup ps 2) before the kill, and by ps 2 alone after it; the final
  // values (pulled through ps 2 for ps 1's shard) count each exactly once.
  check_exact_pushes(config, 3, 150, [&] {
    wait_for_pushes(watch, 1);
    cluster.ps(1).kill(SIGKILL);
    REQUIRE(cluster.ps(1).wait_for(std::chrono::seconds(10)));
  });
  const auto json = watch.stats(2);
  CAPTURE(json);
  CHECK(stat(json, "takeovers") == 1);
  CHECK(cluster.ps(2).log_text().find("takes over ps 1's shard") != std::string::npos);
  // The end-of-run snapshot worker 0 asks of every ps: ps 1's shard is
  // written by ps 2, which serves it, once the asking client moved it there.
  const auto map = shard_map_for(config, exact_push_variables());
  PsClient last(config, kTool, map);
  std::vector<float> w(40000);
  last.wait(last.pull("w", w));
  REQUIRE(last.serving(1) == 2);
  const auto file = config.run_dir / "snapshot" / "ps1.bin";
  std::filesystem::remove(file);
  last.snapshot(1);
  CHECK(std::filesystem::exists(file));
}

TEST_CASE("re-join: a killed primary restarted after the take-over serves its shard again") {
  PsCluster cluster(failover_spec(3, 0.1));
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient watch(config, kTool, shard_map_for(config, exact_push_variables()));
  // ps 1 is killed; ps 2 takes its shard over for the clients; ps 1 is then
  // started again without its state, as a launcher would, while the clients
  // push on: ps 2 hands the shard back to it (the clients follow), and ps 0,
  // whose backup it is, copies its own shard to it again. Every update is
  // counted exactly once through all of it.
  check_exact_pushes(config, 3, 250, [&] {
    wait_for_pushes(watch, 1);
    kill_and_rejoin_ps1(cluster, watch);
  });
  CHECK(cluster.ps(1).log_text().find("re-joined") != std::string::npos);
  // ps 1 received two shards whole: its own, and its copy of ps 0's.
  REQUIRE(
      eventually([&] { return stat(watch.stats(1), "rejoins") == 2; }, std::chrono::seconds(30)));
  CHECK(cluster.ps(0).log_text().find("holds this shard's copy again") != std::string::npos);
  // Serving again: every ps's shard on its own primary, and every copy (ps
  // 0's on the restarted ps 1 too) bit-equal to its primary, versions too.
  const auto map = shard_map_for(config, exact_push_variables());
  PsClient last(config, kTool, map);
  std::vector<float> w(40000);
  last.wait(last.pull("w", w));
  CHECK(last.serving(1) == 1);
  CHECK(copy_mismatches(config) == "");
}

TEST_CASE("re-join: a shard larger than one message is handed back and copied in pieces") {
  // No drops: comparing every chunk's copy below pulls over 2,000 chunks.
  PsCluster cluster(failover_spec(1, 0));
  cluster.start_all();
  const auto& config = cluster.config();
  // 72 MB of values: each ps's shard about 24 MB, past the 16 MiB one
  // message carries.
  const std::vector<VariableSpec> vars = {{"big", 18'000'000, {InitKind::zeros, 0}}};
  const auto map = shard_map_for(config, vars);
  PsClient client(config, 0, map);
  client.hello();
  client.init(1);
  std::vector<float> ones(18'000'000, 1.0f);
  for (int i = 0; i < 3; ++i) client.wait(client.push("big", ones));
  // ps 1 killed and started again at once: its backup ps 2 hands its shard
  // back, and ps 0 copies its own shard to it, both in pieces.
  cluster.ps(1).kill(SIGKILL);
  REQUIRE(cluster.ps(1).wait_for(std::chrono::seconds(10)));
  cluster.start_ps(1);
  PsClient watch(config, kTool, map);
  REQUIRE(
      eventually([&] { return stat(watch.stats(2), "handbacks") == 1; }, std::chrono::seconds(60)));
  REQUIRE(
      eventually([&] { return stat(watch.stats(1), "rejoins") == 2; }, std::chrono::seconds(60)));
  CHECK(cluster.ps(1).log_text().find("messages, ") != std::string::npos);
  // ps 0 logs the copy once ps 1's answer to it arrives, after ps 1 counted it.
  CHECK(eventually(
      [&] {
        return cluster.ps(0).log_text().find("holds this shard's copy again") != std::string::npos;
      },
      std::chrono::seconds(30)));
  // Every update before the kill kept, and the new ps 1 serves and
  // forwards again.
  for (int i = 0; i < 2; ++i) client.wait(client.push("big", ones));
  std::vector<float> values(18'000'000);
  client.wait(client.pull("big", values));
  CHECK(client.serving(1) == 1);
  CHECK(std::ranges::all_of(values, [](float v) { return v == -5.0f; }));
  CHECK(copy_mismatches(config, vars) == "");
}

TEST_CASE("ssp: a killed and restarted primary's shard keeps every update and the bound") {
  auto spec = failover_spec(3, 0.1);
  spec.mode = "ssp";
  spec.train = "staleness_bound: 1";
  PsCluster cluster(spec);
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient watch(config, kTool, shard_map_for(config, exact_push_variables()));
  // Each client reads (push_pull) every step, so no update may be applied
  // more than one step ahead of the slowest worker: on the primaries, on ps
  // 2 serving ps 1's shard from its copy after the kill, and on the
  // restarted ps 1 once its shard (with every worker's clock) is handed back.
  check_exact_pushes(
      config, 3, 250,
      [&] {
        wait_for_pushes(watch, 1);
        kill_and_rejoin_ps1(cluster, watch);
      },
      /*clocked=*/true);
  CHECK(stat(watch.stats(1), "push") > 0);  // the clients pushed to the new ps 1
  for (const std::uint32_t s : {0u, 1u, 2u}) {
    const auto json = watch.stats(s);
    CAPTURE(json);
    CHECK(stat(json, "ssp_staleness_max") <= 1);
    // ps 2's "moved back" answers after the hand-back count as errors.
    if (s != 2) CHECK(stat(json, "errors") == 0);
  }
}

TEST_CASE("backup: the copies apply their primaries' steps through a kill and a re-join") {
  auto spec = failover_spec(3, 0.1);
  spec.mode = "backup";
  spec.train = "backup_workers: 1";
  PsCluster cluster(spec);
  cluster.start_all();
  const auto& config = cluster.config();
  const auto vars = exact_push_variables();
  PsClient watch(config, kTool, shard_map_for(config, vars));
  {
    PsClient setup(config, kTool, shard_map_for(config, vars));
    setup.hello();
    setup.init(1);
  }
  // Three workers, each step a push_pull of its gradient: a step of a chunk
  // applies the mean of the first two (which two differs per step, and
  // the third is dropped as late), so a copy that collected steps of its
  // own would differ from its primary.
  std::vector<std::unique_ptr<ForkedClient>> children;
  for (std::uint32_t k = 0; k < 3; ++k) {
    children.push_back(std::make_unique<ForkedClient>([&, k] {
      PsClient ps(config, k, shard_map_for(config, vars));
      ps.hello();
      std::vector<float> gw(40000), gb(10), out_w(40000), out_b(10);
      for (std::uint32_t s = 0; s < 250; ++s) {
        for (std::size_t i = 0; i < gw.size(); ++i)
          gw[i] = static_cast<float>((k * 7 + s * 3 + i) % 5) - 1.0f;
        for (std::size_t i = 0; i < gb.size(); ++i) gb[i] = static_cast<float>(k + 1);
        const auto w = ps.push_pull("w", gw, out_w);
        const auto b = ps.push_pull("b", gb, out_b);
        ps.wait(w);
        ps.wait(b);
      }
      ps.finished_pushing();
    }));
  }
  wait_for_pushes(watch, 1);
  kill_and_rejoin_ps1(cluster, watch);
  for (auto& c : children) REQUIRE(c->wait_for(std::chrono::seconds(120)) == 0);
  CHECK(cluster.ps(1).log_text().find("re-joined") != std::string::npos);
  REQUIRE(
      eventually([&] { return stat(watch.stats(1), "rejoins") == 2; }, std::chrono::seconds(30)));
  CHECK(copy_mismatches(config) == "");
  // Steps were taken (values moved), and gradients dropped as late.
  std::uint64_t dropped = 0;
  for (const std::uint32_t s : {0u, 1u, 2u}) {
    const auto json = watch.stats(s);
    CAPTURE(json);
    // ps 0 lost its backup with the kill of ps 1, and got it back.
    CHECK(stat(json, "backup_losses") == (s == 0 ? 1 : 0));
    CHECK(stat(json, "replica_forwards") > 0);
    dropped += stat(json, "gradients_dropped");
  }
  CHECK(dropped > 0);
  std::vector<float> b(10);
  watch.wait(watch.pull("b", b));
  CHECK(b[0] < 0);
}

TEST_CASE("fail-over: a primary stopped and continued after its backup took over serves nothing") {
  PsCluster cluster(failover_spec(2, 0));
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient watch(config, kTool, shard_map_for(config, exact_push_variables()));
  std::optional<RawReply> stale_pull, stale_push;
  check_exact_pushes(config, 2, 150, [&] {
    wait_for_pushes(watch, 1);
    cluster.ps(1).kill(SIGSTOP);
    REQUIRE(eventually([&] { return stat(watch.stats(2), "takeovers") == 1; },
                       std::chrono::seconds(30)));
    // Continued: at once it must neither serve its (now stale) values nor
    // take an update, before and after it learns of the take-over.
    RawPeer old(config.ps[1].connect_address());
    cluster.ps(1).kill(SIGCONT);
    stale_pull = old.exchange({chunk_request(config, wire::Op::pull, 1, 0)});
    const auto push = chunk_request(config, wire::Op::push, 1, 0);
    const auto count = wire::decode_header(push).elements;
    std::vector<float> grad(count, 1000.0f);
    std::vector<std::uint8_t> bytes(count * sizeof(float));
    std::memcpy(bytes.data(), grad.data(), bytes.size());
    stale_push = old.exchange({push, bytes});
    REQUIRE(eventually(
        [&] { return cluster.ps(1).log_text().find("no longer serves it") != std::string::npos; },
        std::chrono::seconds(10)));
  });
  CHECK_FALSE(stale_pull.has_value());
  CHECK_FALSE(stale_push.has_value());
  // Fenced, it has nothing of its own to serve: it ends, saying a restart
  // would re-join.
  CHECK(cluster.ps(1).wait_for(std::chrono::seconds(10)) == ps::kExitFenced);
  CHECK(stat(watch.stats(2), "takeovers") == 1);
}

TEST_CASE("tables: a killed primary's rows lose no update through fail-over and re-join") {
  auto spec = failover_spec(3, 0.1);
  spec.tables = "[{name: emb, dim: 4, rows: dynamic}]";
  spec.sparse_optimizer = "{name: sgd, lr: 1}";
  PsCluster cluster(spec);
  cluster.start_all();
  const auto& config = cluster.config();
  const auto keys = table_keys();
  const auto no_variables = shard_map_for(config, std::vector<VariableSpec>{});
  constexpr std::uint32_t kClients = 3, kRounds = 300;
  {
    // Rows of 0 to start from (each row less its initial values, exactly):
    // integer sums then come out the same in any order.
    PsClient setup(config, kTool, no_variables);
    setup.hello();
    std::vector<float> initial(keys.size() * kDim);
    for (std::size_t i = 0; i < keys.size(); ++i)
      init_row({initial.data() + i * kDim, kDim}, config.train.seed, config.tables.at(0), keys[i]);
    setup.wait(setup.sparse_push("emb", keys, initial));
  }
  // Every client pushes integer gradients to a changing part of the rows,
  // every third round without the pull, while ps 1 is killed, its rows
  // served by ps 2 from the copy, and ps 1 restarted without its state.
  std::vector<std::unique_ptr<ForkedClient>> children;
  for (std::uint32_t k = 0; k < kClients; ++k)
    children.push_back(std::make_unique<ForkedClient>([&, k] {
      PsClient ps(config, k, no_variables);
      ps.hello();
      for (std::uint32_t r = 0; r < kRounds; ++r) {
        std::vector<std::uint64_t> some;
        std::vector<float> grads;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          if (!touches(k, r, i)) continue;
          some.push_back(keys[i]);
          for (std::uint32_t j = 0; j < kDim; ++j) grads.push_back(row_grad(k, r, i, j));
        }
        std::vector<float> rows(grads.size());
        ps.wait(r % 3 == 0 ? ps.sparse_push("emb", some, grads)
                           : ps.sparse_push_pull("emb", some, grads, rows));
      }
    }));
  PsClient watch(config, kTool, no_variables);
  REQUIRE(eventually([&] { return stat(watch.stats(1), "sparse_push_pull") >= 100; },
                     std::chrono::seconds(60)));
  kill_and_rejoin_ps1(cluster, watch);
  for (auto& c : children) REQUIRE(c->wait_for(std::chrono::seconds(120)) == 0);
  // The clients were still pushing when ps 1 came back.
  CHECK(stat(watch.stats(1), "sparse_push_pull") > 0);
  REQUIRE(
      eventually([&] { return stat(watch.stats(1), "rejoins") == 2; }, std::chrono::seconds(30)));
  CHECK(cluster.ps(2).log_text().find("table rows") != std::string::npos);

  std::vector<float> expected(keys.size() * kDim, 0.0f);
  for (std::uint32_t k = 0; k < kClients; ++k)
    for (std::uint32_t r = 0; r < kRounds; ++r)
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (touches(k, r, i))
          for (std::uint32_t j = 0; j < kDim; ++j) expected[i * kDim + j] -= row_grad(k, r, i, j);
  PsClient check(config, kTool, no_variables);
  std::vector<float> rows(keys.size() * kDim);
  check.wait(check.sparse_pull("emb", keys, rows));
  CHECK(check.serving(1) == 1);
  CHECK(bit_equal(rows, expected));
  CHECK_FALSE(bit_equal(expected, std::vector<float>(expected.size(), 0.0f)));
  CHECK(row_copy_mismatches(config, keys) == "");
}
