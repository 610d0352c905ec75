// Embedding tables on real parameter servers (docs/embeddings.md): rows
// created on first touch alike on every ps and after a restart, sparse
// pushes applied exactly once under lost messages, bad ids refused with
// nothing changed, tables in checkpoints, whole and incremental, restored
// bit for bit, a damaged delta named and passed over; and the embedding
// layers learning a task through the ps.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "client/compute/cpu/cpu_backend.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/embedding_exchange.h"
#include "shared/embedding.h"
#include "shared/messages.h"
#include "shared/snapshot.h"
#include "tests/support/ps_cluster.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace pstrain::testing;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t kDim = 4;
const std::string kTables = "[{name: emb, dim: 4, rows: dynamic}]";

ShardMap no_variables(const ClusterConfig& config) {
  return shard_map_for(config, std::vector<VariableSpec>{});
}

// The rows of `keys` as every process computes them before any update.
std::vector<float> initial_rows(const ClusterConfig& config,
                                const std::vector<std::uint64_t>& keys) {
  std::vector<float> rows(keys.size() * kDim);
  for (std::size_t i = 0; i < keys.size(); ++i)
    init_row({rows.data() + i * kDim, kDim}, config.train.seed, config.tables.at(0), keys[i]);
  return rows;
}

std::vector<std::uint64_t> spread_keys(std::size_t n) {
  std::vector<std::uint64_t> keys;
  for (std::uint64_t i = 0; i < n; ++i) keys.push_back(i * 7919 + (i << 40));
  std::ranges::sort(keys);
  return keys;
}

// A table's rows in a file, by key: values and state, clock and second.
using RowsByKey =
    std::map<std::uint64_t, std::tuple<std::vector<float>, std::uint64_t, std::uint32_t>>;
RowsByKey rows_in(const Snapshot& snap) {
  RowsByKey out;
  REQUIRE(snap.tables.size() == 1);
  const auto& t = snap.tables[0];
  const auto n = t.row_floats();
  for (std::size_t i = 0; i < t.rows.keys.size(); ++i)
    out[t.rows.keys[i]] = {{t.rows.floats.begin() + static_cast<std::ptrdiff_t>(i * n),
                            t.rows.floats.begin() + static_cast<std::ptrdiff_t>((i + 1) * n)},
                           t.rows.clocks[i],
                           t.rows.seconds[i]};
  return out;
}

// This ps's checkpoint generations, oldest first: (seq, whether a delta).
std::vector<std::pair<std::uint64_t, bool>> generations_of(const std::filesystem::path& checkpoints,
                                                           std::uint32_t ps) {
  std::vector<std::pair<std::uint64_t, bool>> out;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    const auto name = entry.path().filename().string();
    const auto seq = std::stoull(name.substr(name.find('-') + 1));
    const auto stem = "ps" + std::to_string(ps);
    if (std::filesystem::exists(entry.path() / (stem + ".bin"))) out.emplace_back(seq, false);
    if (std::filesystem::exists(entry.path() / (stem + ".delta.bin"))) out.emplace_back(seq, true);
  }
  std::ranges::sort(out);
  return out;
}

}  // namespace

TEST_CASE("embeddings: rows are created alike on every ps count and after a restart") {
  const auto keys = spread_keys(300);
  std::vector<float> first;
  for (const std::uint32_t servers : {2u, 3u}) {
    CAPTURE(servers);
    PsCluster cluster({.ps = servers, .tables = kTables});
    cluster.start_all();
    const auto& config = cluster.config();
    PsClient client(config, 0, no_variables(config));
    client.hello();
    std::vector<float> rows(keys.size() * kDim);
    client.wait(client.sparse_pull("emb", keys, rows));
    CHECK(rows == initial_rows(config, keys));
    // The rows spread over every ps.
    for (std::uint32_t s = 0; s < servers; ++s) {
      std::size_t here = 0;
      for (auto k : keys) here += row_home(k, servers, config.train.seed) == s;
      CHECK(here > keys.size() / servers / 2);
    }
    if (servers == 2) {
      first = rows;
      // A ps that restarts creates its rows again, the same.
      cluster.ps(1).kill(SIGKILL);
      cluster.ps(1).wait_for(10s);
      cluster.start_ps(1);
      PsClient again(config, 0, no_variables(config));
      again.hello();
      std::vector<float> after(rows.size());
      again.wait(again.sparse_pull("emb", keys, after));
      CHECK(after == rows);
    } else {
      CHECK(rows == first);  // the same seed: the same rows, wherever they live
    }
  }
}

TEST_CASE("embeddings: sparse pushes apply exactly once with 10% of messages dropped") {
  for (const std::uint32_t servers : {2u, 3u}) {
    CAPTURE(servers);
    PsCluster cluster({.ps = servers,
                       .retry_interval = 0.05,
                       .fault_drop = 0.1,
                       .tables = kTables,
                       .sparse_optimizer = "{name: sgd, lr: 1}"});
    cluster.start_all();
    const auto& config = cluster.config();
    PsClient client(config, 0, no_variables(config));
    client.hello();
    const auto keys = spread_keys(200);
    std::vector<float> expected = initial_rows(config, keys);
    std::mt19937 rng(5);
    for (int round = 0; round < 25; ++round) {
      // A random half of the rows, integer gradients: SGD at lr 1 keeps
      // every value a float sum the test can repeat exactly.
      std::vector<std::uint64_t> some;
      std::vector<std::size_t> at;
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (rng() % 2) {
          some.push_back(keys[i]);
          at.push_back(i);
        }
      std::vector<float> grads(some.size() * kDim), rows(some.size() * kDim);
      for (std::size_t i = 0; i < some.size(); ++i)
        for (std::uint32_t j = 0; j < kDim; ++j) {
          grads[i * kDim + j] = static_cast<float>(static_cast<int>(rng() % 7) - 3);
          expected[at[i] * kDim + j] -= 1.0f * grads[i * kDim + j];
        }
      client.wait(client.sparse_push_pull("emb", some, grads, rows));
      for (std::size_t i = 0; i < some.size(); ++i)
        for (std::uint32_t j = 0; j < kDim; ++j)
          REQUIRE(rows[i * kDim + j] == expected[at[i] * kDim + j]);
    }
    std::vector<float> rows(keys.size() * kDim);
    client.wait(client.sparse_pull("emb", keys, rows));
    CHECK(rows == expected);
    std::size_t resent = 0;
    for (std::uint32_t s = 0; s < servers; ++s) {
      const auto stats = client.stats(s);
      const auto at = stats.find("\"resends_answered\":");
      REQUIRE(at != std::string::npos);
      resent += std::stoull(stats.substr(at + 19));
    }
    MESSAGE(resent << " resent pushes answered from the record");
  }
}

TEST_CASE("embeddings: repeated, unsorted and foreign ids are refused, and change nothing") {
  PsCluster cluster({.ps = 2, .tables = kTables, .sparse_optimizer = "{name: sgd, lr: 1}"});
  cluster.start_all();
  const auto& config = cluster.config();
  PsClient client(config, 0, no_variables(config));
  client.hello();
  // Keys of ps 0 alone, and one of ps 1.
  std::vector<std::uint64_t> mine;
  std::uint64_t foreign = 0;
  for (std::uint64_t k = 1; mine.size() < 3 || foreign == 0; ++k) {
    if (row_home(k, 2, config.train.seed) == 0) {
      if (mine.size() < 3) mine.push_back(k);
    } else if (foreign == 0) {
      foreign = k;
    }
  }
  const std::vector<float> grads(3 * kDim, 1.0f);
  const auto refused = [&](std::vector<std::uint64_t> keys, const char* why) {
    CAPTURE(why);
    CHECK_THROWS_WITH_AS(client.wait(client.sparse_push("emb", keys, grads)),
                         doctest::Contains(why), PsError);
  };
  refused({mine[0], mine[1], mine[1]}, "is repeated");
  refused({mine[1], mine[0], mine[2]}, "is out of order");
  // The client sends each row to its home; a peer speaking the wire
  // protocol itself can name another ps's row.
  RawPeer peer(config.ps[0].connect_address());
  wire::Header h;
  h.op = wire::Op::sparse_push;
  h.sender = 0;
  h.run_id = config.run_id();
  h.payload_frames = 2;
  h.elements = 2;
  wire::SparseRequest{"emb", kDim}.write(h);
  std::vector<std::uint64_t> ids{mine[0], foreign};
  if (ids[1] < ids[0]) std::swap(ids[0], ids[1]);
  std::vector<std::uint8_t> id_bytes(ids.size() * 8), grad_bytes(2 * kDim * 4);
  std::memcpy(id_bytes.data(), ids.data(), id_bytes.size());
  std::memcpy(grad_bytes.data(), grads.data(), grad_bytes.size());
  const auto reply = peer.exchange({wire::encode_header(h), id_bytes, grad_bytes});
  REQUIRE(reply);
  CHECK(reply->header.status == wire::Status::error);
  CHECK(reply->header.text.find("table 'emb': id " + std::to_string(foreign)) != std::string::npos);
  CHECK(reply->header.text.find("lives on ps 1") != std::string::npos);
  // A NaN anywhere refuses the whole push.
  std::vector<float> poisoned = grads;
  poisoned[5] = std::nanf("");
  CHECK_THROWS_WITH_AS(client.wait(client.sparse_push("emb", mine, poisoned)),
                       doctest::Contains("NaN or infinite"), PsError);
  // Nothing changed: every row is still its initial value.
  std::vector<float> rows(mine.size() * kDim);
  client.wait(client.sparse_pull("emb", mine, rows));
  CHECK(rows == initial_rows(config, mine));
}

TEST_CASE(
    "embeddings: incremental checkpoints carry tables, restored bit for bit; a damaged delta is "
    "named and the generation before it restored") {
  PsCluster cluster({.ps = 2,
                     .checkpoint_every_s = 0.3,
                     .checkpoint_keep = 1000,
                     .checkpoint = "incremental: true, full_every: 1000",
                     .tables = kTables,
                     .sparse_optimizer = "{name: adagrad, lr: 0.1}"});
  cluster.start_all();
  const auto& config = cluster.config();
  const auto keys = spread_keys(400);
  std::vector<Snapshot> before;
  {
    PsClient client(config, 0, no_variables(config));
    client.hello();
    std::mt19937 rng(11);
    // Pushes to a random tenth of the rows, over about ten checkpoints.
    for (int round = 0; round < 12; ++round) {
      std::vector<std::uint64_t> some;
      for (const auto k : keys)
        if (rng() % 10 == 0) some.push_back(k);
      std::vector<float> grads(some.size() * kDim);
      for (auto& g : grads) g = static_cast<float>(static_cast<int>(rng() % 9) - 4) / 4;
      client.wait(client.sparse_push("emb", some, grads));
      std::this_thread::sleep_for(250ms);
    }
    // At least one checkpoint after the last push, before the last one.
    std::this_thread::sleep_for(500ms);
    for (std::uint32_t s = 0; s < 2; ++s) before.push_back(read_snapshot(client.snapshot(s)));
  }
  const auto checkpoints = config.run_dir / "checkpoints";
  for (std::uint32_t s = 0; s < 2; ++s) {
    CHECK(rows_in(before[s]).size() > 100);
    cluster.ps(s).kill(SIGTERM);
    REQUIRE(cluster.ps(s).wait_for(10s) == 0);
    // Whole files and deltas, a whole one every third.
    // A whole file, then deltas only: the restore goes through all of them.
    const auto gens = generations_of(checkpoints, s);
    REQUIRE(gens.size() >= 4);
    for (std::size_t i = 0; i < gens.size(); ++i) CHECK(gens[i].second == (i > 0));
  }
  for (std::uint32_t s = 0; s < 2; ++s) cluster.start_ps(s, {"--restore", "latest"});
  {
    PsClient tool(config, kTool, no_variables(config));
    for (std::uint32_t s = 0; s < 2; ++s)
      CHECK(rows_in(read_snapshot(tool.snapshot(s))) == rows_in(before[s]));
  }

  // Ps 0's newest delta, damaged, with the generations after it gone.
  cluster.ps(0).kill(SIGKILL);
  cluster.ps(0).wait_for(10s);
  auto gens = generations_of(checkpoints, 0);
  while (!gens.back().second) {
    std::filesystem::remove_all(checkpoints / ("ckpt-" + std::to_string(gens.back().first)));
    gens.pop_back();
  }
  REQUIRE(gens.size() >= 2);
  const auto damaged =
      checkpoints / ("ckpt-" + std::to_string(gens.back().first)) / "ps0.delta.bin";
  const auto previous = checkpoints / ("ckpt-" + std::to_string(gens[gens.size() - 2].first));
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(damaged) / 2));
    f.put('\x5a');
  }
  RowsByKey fallback;
  {
    auto& ps = cluster.start_ps(0, {"--restore", "latest"});
    INFO("damaged ", damaged.string());
    PsClient tool(config, kTool, no_variables(config));
    fallback = rows_in(read_snapshot(tool.snapshot(0)));
    CHECK_MESSAGE(
        ps.log_text().find("checkpoint " + damaged.string() + " is unusable") != std::string::npos,
        ps.log_text());
    ps.kill(SIGKILL);
    ps.wait_for(10s);
  }
  // What it restored is that generation's state, as an explicit restore of
  // it gives.
  cluster.start_ps(0, {"--restore", previous.string()});
  PsClient tool(config, kTool, no_variables(config));
  CHECK(fallback == rows_in(read_snapshot(tool.snapshot(0))));
  CHECK(fallback.size() > 50);
}

namespace {

// A task only the ids can answer: each of kFields fields draws one of
// kVocab ids; every id has a hidden sign, and the label says whether most
// of a sample's ids are positive.
constexpr int kFields = 3, kVocab = 150;
float hidden_sign(std::uint64_t id) { return splitmix64(id ^ 0xabcdefULL) % 2 ? 1.0f : -1.0f; }
struct IdBatch {
  std::vector<std::uint64_t> ids;
  std::vector<std::int32_t> labels;
};
IdBatch id_batch(std::mt19937& rng, int n) {
  IdBatch b;
  for (int s = 0; s < n; ++s) {
    float vote = 0;
    for (int f = 0; f < kFields; ++f) {
      const std::uint64_t id = std::uint64_t(f) * kVocab + rng() % kVocab;
      b.ids.push_back(id);
      vote += hidden_sign(id);
    }
    b.labels.push_back(vote > 0 ? 1 : 0);
  }
  return b;
}

}  // namespace

TEST_CASE("embeddings: embedding and embedding_bag layers learn a task of ids through the ps") {
  for (const std::string type : {"embedding", "embedding_bag"}) {
    CAPTURE(type);
    PsCluster cluster({.ps = 2,
                       .tables = "[{name: emb, dim: 8, rows: dynamic}]",
                       .sparse_optimizer = "{name: adagrad, lr: 0.1}"});
    cluster.start_all();
    const auto& config = cluster.config();
    ModelConfig layers{.preset = "custom",
                       .layers = {{.type = type, .table = "emb", .ids = kFields},
                                  {.type = "dense", .units = 16},
                                  {.type = "relu"},
                                  {.type = "dense", .units = 2}}};
    auto backend = make_cpu_backend(1);
    constexpr int kBatch = 64;
    Model model(layers, *backend, {0, 1, 1}, 2, kBatch, config.tables);
    REQUIRE(model.embeddings().size() == 1);
    CHECK(model.embeddings()[0].bag == (type == "embedding_bag"));
    model.initialize(1);
    PsClient client(config, 0, no_variables(config));
    client.hello();
    EmbeddingExchange exchange(model, client, config.tables);
    std::mt19937 rng(9);
    const auto step = [&](const IdBatch& b, bool train) {
      const std::span<const std::uint64_t> ids(b.ids);
      exchange.pull(kBatch, std::span(&ids, 1));
      std::copy(b.labels.begin(), b.labels.end(), model.label_buffer());
      if (!train) {
        model.forward(kBatch);
        return;
      }
      model.forward_backward(kBatch, [](std::size_t) {});
      exchange.push();
      // The dense layers train here, by plain SGD: the rows train on the ps.
      for (std::size_t v = 0; v < model.variables().size(); ++v)
        backend->axpby(-0.1f, model.grad(v).data(), 1.0f, model.param(v).data(),
                       model.variables()[v].size);
    };
    for (int i = 0; i < 400; ++i) step(id_batch(rng, kBatch), true);
    exchange.wait();
    int correct = 0;
    for (int i = 0; i < 8; ++i) {
      const auto b = id_batch(rng, kBatch);
      step(b, false);
      for (int s = 0; s < kBatch; ++s) {
        const float* logit = model.logits() + 2 * s;
        correct += (logit[1] > logit[0] ? 1 : 0) == b.labels[static_cast<std::size_t>(s)];
      }
    }
    const double accuracy = correct / (8.0 * kBatch);
    MESSAGE(type << ": test accuracy " << accuracy);
    CHECK(accuracy > 0.95);
    // The rows the ps trained are every id seen, spread over both ps.
    std::size_t rows = 0;
    for (std::uint32_t s = 0; s < 2; ++s) {
      const auto stats = client.stats(s);
      const std::string key = "\"emb\":{\"rows\":";
      const auto at = stats.find(key);
      REQUIRE(at != std::string::npos);
      const auto here = std::stoull(stats.substr(at + key.size()));
      CHECK(here > 100);
      rows += here;
    }
    CHECK(rows == kFields * kVocab);
  }
}

TEST_CASE("embeddings: a prefetched batch has the rows from before the push of the batch before") {
  PsCluster cluster({.ps = 2, .tables = kTables, .sparse_optimizer = "{name: sgd, lr: 1}"});
  cluster.start_all();
  const auto& config = cluster.config();
  ModelConfig layers{.preset = "custom",
                     .layers = {{.type = "embedding_bag", .table = "emb", .ids = 2},
                                {.type = "dense", .units = 2}}};
  auto backend = make_cpu_backend(1);
  Model model(layers, *backend, {0, 1, 1}, 2, 2, config.tables);
  model.initialize(1);
  PsClient client(config, 0, no_variables(config));
  client.hello();
  EmbeddingExchange exchange(model, client, config.tables);
  // Batch 1 touches rows 10, 20, 30; batch 2 rows 20, 30, 40: two shared.
  const std::vector<std::uint64_t> first{10, 20, 30, 10}, second{20, 40, 30, 40};
  exchange.pull_samples(2, first);
  CHECK(exchange.last_rows() == 3);
  exchange.prefetch(2, second);  // before batch 1's push
  for (int i = 0; i < 2; ++i) model.label_buffer()[i] = i;
  model.forward_backward(2, [](std::size_t) {});
  exchange.push();
  exchange.pull_samples(2, second);
  CHECK(exchange.last_rows() == 3);
  CHECK(exchange.last_stale_rows() == 2);
  // The prefetched rows are the initial ones (the push came after the
  // pull): the logits are those of the rows as every process creates them.
  model.forward(2);
  const std::vector<float> prefetched(model.logits(), model.logits() + 4);
  const std::vector<std::uint64_t> keys{20, 30, 40};
  model.set_embedding_batch(0, 2, initial_rows(config, keys),
                            std::vector<std::uint32_t>{0, 2, 1, 2});
  model.forward(2);
  CHECK(std::vector<float>(model.logits(), model.logits() + 4) == prefetched);
  // A batch pulled without a prefetch sees every push before it.
  exchange.pull_samples(2, second);
  model.forward(2);
  CHECK(std::vector<float>(model.logits(), model.logits() + 4) != prefetched);
  CHECK(exchange.last_stale_rows() == 0);
}
