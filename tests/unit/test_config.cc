// cluster.yaml parsing, --set overrides, the canonical form and its hash, and
// the error messages users see for bad files.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "shared/config.h"
#include "shared/init.h"
#include "shared/modes.h"
#include "tests/support/child_process.h"

namespace pstrain {
namespace {

const std::string kMinimal =
    "ps: [{host: 127.0.0.1, port: 7000}, {host: 127.0.0.1, port: 7001}]\n"
    "workers: {count: 2}\n";

ClusterConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, overrides, "t.yaml");
}

// The ConfigError message, or "" when the text is accepted.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: the default cluster.yaml parses and round-trips") {
  const auto c = load_config(std::filesystem::path(PSTRAIN_SOURCE_DIR) / "cluster.yaml");
  CHECK_FALSE(c.ps.empty());
  CHECK((c.workers_auto || !c.workers.empty()));
  CHECK(c.run_dir == std::filesystem::path("runs") / c.job);
  CHECK(parse(c.to_yaml()).to_yaml() == c.to_yaml());
}

TEST_CASE("config: unset keys take the documented defaults") {
  const auto c = parse(kMinimal);
  CHECK(c.job == "pstrain");
  CHECK(c.run_dir == "runs/pstrain");
  CHECK(c.mode == Mode::async);
  REQUIRE(c.ps.size() == 2);
  CHECK(c.ps[1].port == 7001);
  CHECK(c.ps[1].connect_address() == "tcp://127.0.0.1:7001");
  CHECK(c.ps[1].bind_address() == "tcp://127.0.0.1:7001");
  REQUIRE(c.workers.size() == 2);
  CHECK(c.workers[1].host == "127.0.0.1");
  CHECK(c.workers[1].device == Device::cpu);
  CHECK(c.workers[1].gpu == -1);
  CHECK(c.optimizer.kind == OptimizerKind::sgd);
  CHECK(c.model.preset == "mlp");
  CHECK(c.data.name == "fashion-mnist");
  CHECK(c.train.batch_size == 64);
  CHECK(c.net.chunk_bytes == 256 * 1024);
}

TEST_CASE("config: train.accumulate_steps and train.precision parse, print and reject bad values") {
  const auto base = parse(kMinimal);
  CHECK(base.train.accumulate_steps == 1);
  CHECK(base.train.precision == Precision::fp32);
  const auto c = parse(kMinimal, {"train.accumulate_steps=4", "train.precision=bf16"});
  CHECK(c.train.accumulate_steps == 4);
  CHECK(c.train.precision == Precision::bf16);
  CHECK(c.to_yaml().find("precision: bf16") != std::string::npos);
  CHECK(parse(c.to_yaml()).train.accumulate_steps == 4);
  CHECK(parse(kMinimal, {"train.precision=fp16"}).train.precision == Precision::fp16);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"train.accumulate_steps=0"}),
                       doctest::Contains("train.accumulate_steps"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"train.precision=fp8"}),
                       doctest::Contains("train.precision"), ConfigError);
}

TEST_CASE("config: train.pipeline, train.trace_* and optimizer.staleness_lr") {
  const auto base = parse(kMinimal);
  CHECK(base.train.pipeline == 0);
  CHECK(base.train.trace_steps == 50);
  CHECK(base.train.trace_skip == 5);
  CHECK_FALSE(base.optimizer.staleness_lr);
  for (const char* mode : {"async", "ssp"}) {
    const auto c = parse(kMinimal, {std::string("mode=") + mode, "train.pipeline=1",
                                    "optimizer.staleness_lr=true", "train.trace_steps=7"});
    CHECK(c.train.pipeline == 1);
    CHECK(c.optimizer.staleness_lr);
    CHECK(parse(c.to_yaml()).train.trace_steps == 7);
  }
  for (const char* mode : {"sync", "local", "backup"}) {
    const std::string why =
        "train.pipeline: applies to modes async and ssp, not to mode " + std::string(mode);
    CHECK_THROWS_WITH_AS(parse(kMinimal, {std::string("mode=") + mode, "train.pipeline=1"}),
                         doctest::Contains(why.c_str()), ConfigError);
  }
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"train.pipeline=2"}), doctest::Contains("train.pipeline"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"train.trace_steps=0"}),
                       doctest::Contains("train.trace_steps"), ConfigError);
}

TEST_CASE("config: replication.replicas, and what it needs") {
  const auto base = parse(kMinimal);
  CHECK(base.replication.replicas == 1);
  // Off, it is left out of the canonical file, so the config hash of a run
  // without it is what it was before the section existed.
  CHECK(base.to_yaml().find("replication") == std::string::npos);
  const auto& two_ps = kMinimal;
  for (const char* mode : {"async", "sync", "ssp"}) {
    const auto c = parse(two_ps, {std::string("mode=") + mode, "replication.replicas=2",
                                  "replication.backup_silence=0.5"});
    CHECK(c.replication.replicas == 2);
    CHECK(parse(c.to_yaml()).replication.backup_silence == 0.5);
    CHECK(c.hash() != parse(two_ps, {std::string("mode=") + mode}).hash());
  }
  CHECK_THROWS_WITH_AS(parse(two_ps, {"mode=local", "replication.replicas=2"}),
                       doctest::Contains("replication.replicas: 2 applies to modes async, sync, "
                                         "ssp and backup, not to mode local"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse("ps: [{host: 127.0.0.1, port: 7000}]\nworkers: {count: 2}\n",
                             {"replication.replicas=2"}),
                       doctest::Contains("2 needs two ps at least (the cluster has 1)"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      parse(two_ps, {"replication.replicas=2", "replication.backup_silence=30"}),
      doctest::Contains("replication.backup_silence: must be shorter than net.request_timeout"),
      ConfigError);
  CHECK_THROWS_WITH_AS(parse(two_ps, {"replication.replicas=3"}),
                       doctest::Contains("replication.replicas"), ConfigError);
  // Tables are replicated; rows that a copy could not follow alike are not.
  CHECK(parse(two_ps, {"replication.replicas=2", "model=dlrm"}).tables.size() > 0);
  const auto with_table = [&](const std::string& extra) {
    return parse(two_ps + "tables: [{name: emb, dim: 4" + extra + "}]\n",
                 {"replication.replicas=2"});
  };
  CHECK(with_table(", max_rows_per_ps: 1000").tables.at(0).max_rows_per_ps == 1000);
  CHECK_THROWS_WITH_AS(with_table(", expire_after_s: 60"),
                       doctest::Contains("2 cannot keep table 'emb' with expire_after_s"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(with_table(", admit_after: 2"),
                       doctest::Contains("2 cannot keep table 'emb' with admit_after"),
                       ConfigError);
}

TEST_CASE("config: emulated workers need train.emulated_step_ms, which needs them") {
  const auto c = parse(kMinimal, {"workers.device=emulated", "train.emulated_step_ms=12.5"});
  CHECK(c.workers.at(1).device == Device::emulated);
  CHECK(c.train.emulated_step_ms == 12.5);
  const auto again = parse(c.to_yaml());
  CHECK(again.workers.at(0).device == Device::emulated);
  CHECK(again.train.emulated_step_ms == 12.5);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"workers.device=emulated"}),
                       doctest::Contains("train.emulated_step_ms: give the time"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"train.emulated_step_ms=5"}),
                       doctest::Contains("there is none"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"workers.device=emulated", "train.emulated_step_ms=-1"}),
                       doctest::Contains("train.emulated_step_ms"), ConfigError);
  // An emulated worker sleeps: it takes none of its host's cores from the ps.
  CHECK(ps_apply_threads(c, 0, 4) == 2);
}

TEST_CASE("config: net.io_threads, and the I/O threads a process gets") {
  CHECK(parse(kMinimal).net.io_threads == 0);
  const auto c = parse(kMinimal, {"net.io_threads=3"});
  CHECK(c.net.io_threads == 3);
  CHECK(parse(c.to_yaml()).net.io_threads == 3);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"net.io_threads=65"}), doctest::Contains("net.io_threads"),
                       ConfigError);
  CHECK(io_threads(3, 1, 2) == 3);   // as configured, whatever the host
  CHECK(io_threads(0, 4, 2) == 1);   // a small host: one
  CHECK(io_threads(0, 4, 16) == 2);  // one per 8 cores
  CHECK(io_threads(0, 2, 64) == 2);  // no more than the connections
  CHECK(io_threads(0, 16, 64) == 8);
  CHECK(io_threads(0, 0, 64) == 1);  // a process with no peers yet still has one
  CHECK(io_threads(0, 3, 0) == 1);   // hardware_concurrency() unknown
}

TEST_CASE("config: embedding tables and optimizer.sparse parse, print and reject bad values") {
  const auto none = parse(kMinimal);
  CHECK(none.tables.empty());
  CHECK(none.to_yaml().find("tables") == std::string::npos);  // hashes stay as they were
  CHECK(none.optimizer.sparse.kind == RowOptimizerKind::adagrad);
  const auto c = parse(kMinimal +
                       "tables: [{name: user, dim: 16}, {name: cat, dim: 8, rows: 1000}]\n"
                       "optimizer: {sparse: {name: ftrl, lr: 0.05, l1: 1}}\n");
  REQUIRE(c.tables.size() == 2);
  CHECK(c.tables[0].name == "user");
  CHECK(c.tables[0].dim == 16);
  CHECK_FALSE(c.tables[0].rows.has_value());
  CHECK(c.tables[1].rows == 1000u);
  CHECK(c.optimizer.sparse.kind == RowOptimizerKind::ftrl);
  CHECK(c.optimizer.sparse.l1 == 1.0f);
  const auto again = parse(c.to_yaml());
  CHECK(again.tables.size() == 2);
  CHECK(again.tables[1].rows == 1000u);
  CHECK(again.hash() == c.hash());
  CHECK(error_of(kMinimal + "tables: [{name: a, dim: 4}, {name: a, dim: 2}]\n")
            .find("tables.1.name") != std::string::npos);
  CHECK(error_of(kMinimal + "tables: [{name: a, dim: 0}]\n").find("tables.0.dim") !=
        std::string::npos);
  CHECK(error_of(kMinimal + "tables: [{name: a, dim: 4, rows: 0}]\n").find("tables.0.rows") !=
        std::string::npos);
  CHECK(error_of(kMinimal + "tables: [{dim: 4}]\n").find("tables.0.name") != std::string::npos);
  CHECK(error_of(kMinimal + "optimizer: {sparse: {name: adamw}}\n").find("optimizer.sparse.name") !=
        std::string::npos);
}

TEST_CASE("config: train.cuda_graphs is on by default, parses, prints and rejects non-booleans") {
  CHECK(parse(kMinimal).train.cuda_graphs);
  const auto off = parse(kMinimal, {"train.cuda_graphs=false"});
  CHECK_FALSE(off.train.cuda_graphs);
  CHECK(off.to_yaml().find("cuda_graphs: false") != std::string::npos);
  CHECK_FALSE(parse(off.to_yaml()).train.cuda_graphs);
  CHECK_THROWS_WITH_AS(parse(kMinimal, {"train.cuda_graphs=sometimes"}),
                       doctest::Contains("train.cuda_graphs"), ConfigError);
}

TEST_CASE("config: train.on_worker_loss defaults by mode, a given value wins") {
  CHECK(parse(kMinimal).train.on_worker_loss == WorkerLoss::continue_);
  CHECK(parse(kMinimal, {"mode=sync"}).train.on_worker_loss == WorkerLoss::fail);
  CHECK(parse(kMinimal, {"mode=async", "train.on_worker_loss=fail"}).train.on_worker_loss ==
        WorkerLoss::fail);
  CHECK(parse(kMinimal, {"mode=sync", "train.on_worker_loss=continue"}).train.on_worker_loss ==
        WorkerLoss::continue_);
  const auto sync = parse(kMinimal, {"mode=sync"});
  CHECK(sync.to_yaml().find("on_worker_loss: fail") != std::string::npos);
  CHECK(parse(sync.to_yaml()).to_yaml() == sync.to_yaml());
}

TEST_CASE("modes: one table says what each mode implies, and the config reads it") {
  // The table of shared/modes.h, spelled out: a change to it must be meant.
  struct Row {
    const char* name;
    ServerPolicy server;
    WorkerStrategy worker;
    WorkerLoss loss;
    bool allreduce;
  };
  for (const Row& row :
       {Row{"async", ServerPolicy::async, WorkerStrategy::through_ps, WorkerLoss::continue_, false},
        Row{"ssp", ServerPolicy::ssp, WorkerStrategy::through_ps, WorkerLoss::continue_, false},
        Row{"backup", ServerPolicy::backup, WorkerStrategy::through_ps, WorkerLoss::continue_,
            false},
        Row{"sync", ServerPolicy::async, WorkerStrategy::allreduce, WorkerLoss::fail, true},
        Row{"local", ServerPolicy::async, WorkerStrategy::local_sgd, WorkerLoss::fail, true}}) {
    INFO(row.name);
    const ClusterConfig c = parse(kMinimal, {std::string("mode=") + row.name});
    const ModeTraits& t = traits(c.mode);
    CHECK(t.mode == c.mode);
    CHECK(t.server == row.server);
    CHECK(t.worker == row.worker);
    CHECK(t.on_worker_loss == row.loss);
    CHECK(t.allreduce() == row.allreduce);
    CHECK(c.train.on_worker_loss == row.loss);  // the config's default is the table's
  }
}

TEST_CASE("config: every section is read") {
  const auto c = parse(
      "job: exp-1.a_b\n"
      "run_dir: /tmp/x\n"
      "mode: sync\n"
      "ps:\n"
      "  - {host: 10.0.0.1, port: 7100, bind: 0.0.0.0}\n"
      "  - {host: '::1', port: 7100}\n"
      "workers:\n"
      "  - {host: 10.0.0.2, device: cuda, gpu: 1}\n"
      "  - {device: auto, gpu: auto}\n"
      "  - {}\n"
      "optimizer: {name: adam, lr: 0.001, beta1: 0.8, beta2: 0.99, eps: 1e-6,\n"
      "            momentum: 0.5, nesterov: true, initial_accumulator: 0.2,\n"
      "            weight_decay: 0.0001}\n"
      "model:\n"
      "  - {type: conv2d, filters: 8, kernel: 3}\n"
      "  - {type: relu}\n"
      "  - {type: maxpool2d, kernel: 2}\n"
      "  - {type: flatten}\n"
      "  - {type: dense, units: 10}\n"
      "data: {name: synthetic, dir: /d, synthetic_train: 100, synthetic_test: 10}\n"
      "train: {batch_size: 32, epochs: 0.5, seed: 18446744073709551615, eval_every: 0,\n"
      "        threads: 2, sync_every: 5, lr_scaling: yes, warmup_steps: 10,\n"
      "        straggler_worker: 2, straggler_delay_ms: 12.5, straggler_jitter_ms: 2.5,\n"
      "        straggler_pause_probability: 1, straggler_pause_ms: 300, bucket_bytes: 4096}\n"
      "net: {chunk_bytes: 4, request_timeout: 2, worker_timeout: 3, heartbeat: 0.25}\n");
  CHECK(c.job == "exp-1.a_b");
  CHECK(c.run_dir == "/tmp/x");
  CHECK(c.mode == Mode::sync);
  CHECK(c.ps[0].bind_address() == "tcp://0.0.0.0:7100");
  CHECK(c.ps[0].connect_address() == "tcp://10.0.0.1:7100");
  CHECK(c.ps[1].connect_address() == "tcp://[::1]:7100");
  REQUIRE(c.workers.size() == 3);
  CHECK(c.workers[0].host == "10.0.0.2");
  CHECK(c.workers[0].device == Device::cuda);
  CHECK(c.workers[0].gpu == 1);
  CHECK(c.workers[1].device == Device::auto_);
  CHECK(c.workers[1].gpu == -1);
  CHECK(c.optimizer.kind == OptimizerKind::adam);
  CHECK(c.optimizer.lr == 0.001f);
  CHECK(c.optimizer.beta1 == 0.8f);
  CHECK(c.optimizer.beta2 == 0.99f);
  CHECK(c.optimizer.eps == 1e-6f);
  CHECK(c.optimizer.nesterov);
  CHECK(c.optimizer.weight_decay == 0.0001f);
  CHECK(c.model.preset == "custom");
  REQUIRE(c.model.layers.size() == 5);
  CHECK(c.model.layers[0].type == "conv2d");
  CHECK(c.model.layers[0].filters == 8);
  CHECK(c.model.layers[0].kernel == 3);
  CHECK(c.model.layers[2].kernel == 2);
  CHECK(c.model.layers[4].units == 10);
  CHECK(c.data.name == "synthetic");
  CHECK(c.data.synthetic_train == 100);
  CHECK(c.train.epochs == 0.5);
  CHECK(c.train.seed == 18446744073709551615ULL);
  CHECK(c.train.eval_every == 0);
  CHECK(c.train.lr_scaling);
  CHECK(c.train.straggler_worker == 2);
  CHECK(c.train.straggler_delay_ms == 12.5);
  CHECK(c.train.straggler_jitter_ms == 2.5);
  CHECK(c.train.straggler_pause_probability == 1);
  CHECK(c.train.straggler_pause_ms == 300);
  CHECK(c.train.bucket_bytes == 4096);
  CHECK(c.net.chunk_bytes == 4);
  CHECK(c.net.heartbeat == 0.25);
}

TEST_CASE("config: an empty section takes its defaults") {
  const auto c = parse(kMinimal + "train:\noptimizer: ~\n", {"net.heartbeat=2"});
  CHECK(c.train.batch_size == 64);
  CHECK(c.optimizer.kind == OptimizerKind::sgd);
  CHECK(c.net.heartbeat == 2);
  CHECK(parse(kMinimal + "train:\n", {"train.seed=3"}).train.seed == 3);
}

TEST_CASE("config: workers: auto is kept for the launcher") {
  const auto c = parse("ps: [{host: h, port: 1}]\nworkers: auto\n");
  CHECK(c.workers_auto);
  CHECK(c.workers.empty());
}

TEST_CASE("config: --set overrides") {
  SUBCASE("scalars, parsed as YAML") {
    const auto c = parse(kMinimal, {"optimizer.lr=0.05", "mode=sync", "train.lr_scaling=true"});
    CHECK(c.optimizer.lr == 0.05f);
    CHECK(c.mode == Mode::sync);
    CHECK(c.train.lr_scaling);
  }
  SUBCASE("nested keys in sections the file does not have") {
    const auto c = parse(kMinimal, {"train.seed=7", "net.chunk_bytes=1024"});
    CHECK(c.train.seed == 7);
    CHECK(c.net.chunk_bytes == 1024);
  }
  SUBCASE("list indices") {
    const auto c = parse(kMinimal + "optimizer: {}\n", {"ps.1.port=9000", "workers={count: 1}"});
    CHECK(c.ps[1].port == 9000);
    const auto d = parse("ps: [{host: a, port: 1}]\nworkers: [{}, {}]\n",
                         {"workers.1.device=cuda", "workers.1.gpu=3"});
    CHECK(d.workers[0].device == Device::cpu);
    CHECK(d.workers[1].device == Device::cuda);
    CHECK(d.workers[1].gpu == 3);
  }
  SUBCASE("one past the end appends") {
    const auto c = parse(kMinimal, {"ps.2={host: 127.0.0.1, port: 7002}"});
    REQUIRE(c.ps.size() == 3);
    CHECK(c.ps[2].port == 7002);
  }
  SUBCASE("preset switch and custom models") {
    CHECK(parse(kMinimal, {"model=cnn"}).model.preset == "cnn");
    const auto c = parse(kMinimal, {"model=[{type: flatten}, {type: dense, units: 10}]"});
    CHECK(c.model.preset == "custom");
    CHECK(c.model.layers.size() == 2);
  }
  SUBCASE("the shorthand workers count") {
    CHECK(parse(kMinimal, {"workers.count=3"}).workers.size() == 3);
  }
  SUBCASE("the last override of a key wins; values may contain '='") {
    const auto c = parse(kMinimal, {"train.epochs=2", "train.epochs=4", "data.dir=/a=b"});
    CHECK(c.train.epochs == 4);
    CHECK(c.data.dir == "/a=b");
  }
  SUBCASE("a word YAML reserves is taken as a string") {
    CHECK(parse(kMinimal, {"ps.0.bind=*"}).ps[0].bind_address() == "tcp://*:7000");
  }
  SUBCASE("switching optimizer keeps its other keys valid") {
    const auto c =
        parse(kMinimal + "optimizer: {name: momentum, momentum: 0.5}\n", {"optimizer.name=adam"});
    CHECK(c.optimizer.kind == OptimizerKind::adam);
  }
}

TEST_CASE("config: the hash is stable and covers every value") {
  const auto base = parse(kMinimal);
  CHECK(base.hash() == fnv1a64(base.to_yaml()));
  // Layout, comments, key order and spelled-out defaults do not matter.
  const auto same = parse(
      "# comment\n"
      "workers:\n  count: 2\n"
      "ps:\n  - host: 127.0.0.1\n    port: 7000\n    bind: 127.0.0.1\n"
      "  - {port: 7001, host: 127.0.0.1}\n"
      "train: {batch_size: 64}\n");
  CHECK(same.hash() == base.hash());

  const std::vector<std::string> changes = {
      "job=other",
      "run_dir=elsewhere",
      "mode=sync",
      "ps.0.port=7005",
      "ps.0.bind=0.0.0.0",
      "workers.count=3",
      "workers.device=cuda",
      "workers.host=10.0.0.9",
      "workers=auto",
      "optimizer.name=adam",
      "optimizer.lr=0.2",
      "optimizer.momentum=0.5",
      "optimizer.nesterov=true",
      "optimizer.beta1=0.5",
      "optimizer.beta2=0.5",
      "optimizer.eps=1e-7",
      "optimizer.initial_accumulator=0.5",
      "optimizer.weight_decay=0.1",
      "model=cnn",
      "model=[{type: flatten}]",
      "data.name=synthetic",
      "data.dir=/x",
      "data.synthetic_train=5",
      "data.synthetic_test=5",
      "train.batch_size=65",
      "train.epochs=1.5",
      "train.seed=1",
      "train.eval_every=1",
      "train.threads=2",
      "train.sync_every=2",
      "train.lr_scaling=true",
      "train.warmup_steps=1",
      "train.straggler_worker=1",
      "train.straggler_worker=all",
      "train.straggler_delay_ms=1",
      "train.straggler_jitter_ms=1",
      "train.straggler_pause_probability=0.5",
      "train.straggler_pause_ms=1",
      "train.bucket_bytes=1024",
      "train.accumulate_steps=2",
      "train.precision=bf16",
      "train.cuda_graphs=false",
      "net.chunk_bytes=1024",
      "net.request_timeout=1",
      "net.worker_timeout=2",
      "net.heartbeat=0.5",
  };
  for (const auto& change : changes) {
    INFO(change);
    CHECK(parse(kMinimal, {change}).hash() != base.hash());
  }
}

TEST_CASE("config: to_yaml round-trips") {
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"workers=auto",
       "model=[{type: conv2d, filters: 4, kernel: 5}, {type: maxpool2d, kernel: 2},"
       " {type: flatten}, {type: relu}, {type: dense, units: 10}]"},
      {"workers=[{host: a, device: cuda, gpu: 2}, {device: auto}]", "ps.0.bind='*'",
       "optimizer={name: adagrad, lr: 0.3, eps: 3e-9}", "train.epochs=0.1", "job=\"true\"",
       "data.dir='/path with: colon'", "train.straggler_delay_ms=0.1"},
      {"train.straggler_worker=all", "train.straggler_pause_probability=0.05"},
      {"data.name=criteo", "data.train=/d/train.tsv.gz", "data.test_fraction=0.25",
       "data.block_lines=100", "data.synthetic_ctr={seed: 7, zipf_s: 0.9}"},
  };
  for (const auto& overrides : variants) {
    const auto c = parse(kMinimal, overrides);
    const auto again = parse(c.to_yaml());
    CHECK(again.to_yaml() == c.to_yaml());
    CHECK(again.hash() == c.hash());
  }
  const auto c = parse(kMinimal, variants[2]);
  const auto again = parse(c.to_yaml());
  CHECK(again.job == "true");
  CHECK(again.data.dir == "/path with: colon");
  CHECK(again.optimizer.lr == 0.3f);
  CHECK(again.optimizer.eps == 3e-9f);
  CHECK(again.workers[0].gpu == 2);
  CHECK(again.ps[0].bind_address() == "tcp://*:7000");
  const auto every = parse(parse(kMinimal, variants[3]).to_yaml());
  CHECK(every.train.straggler_worker == kEveryWorker);
  CHECK(every.to_yaml().find("straggler_worker: all") != std::string::npos);
}

TEST_CASE("config: bad files name the key and the problem") {
  struct Case {
    std::string text;
    std::vector<std::string> overrides;
    std::string expected;
  };
  const std::string m = kMinimal;
  const std::vector<Case> cases = {
      // unknown keys at each level
      {m + "batchsize: 3\n", {}, "t.yaml: batchsize: unknown key (expected one of: job, run_dir, "},
      {m + "train: {batchsize: 3}\n",
       {},
       "t.yaml: train.batchsize: unknown key (expected one of: batch_size, epochs, "},
      {m + "optimizer: {rate: 3}\n", {}, "t.yaml: optimizer.rate: unknown key"},
      {m + "data: {path: /x}\n", {}, "t.yaml: data.path: unknown key"},
      {m + "net: {timeout: 3}\n", {}, "t.yaml: net.timeout: unknown key"},
      {"ps: [{host: a, port: 1, prot: 2}]\nworkers: {count: 1}\n",
       {},
       "t.yaml: ps.0.prot: unknown key"},
      {"ps: [{host: a, port: 1}]\nworkers: [{gpus: 1}]\n",
       {},
       "t.yaml: workers.0.gpus: unknown key"},
      {"ps: [{host: a, port: 1}]\nworkers: {count: 1, cnt: 2}\n",
       {},
       "t.yaml: workers.cnt: unknown key"},
      {m + "model: [{type: relu, units: 3}]\n",
       {},
       "t.yaml: model.0.units: unknown key (expected one of: type, name, inputs)"},
      {m, {"train.batchsize=3"}, "t.yaml: train.batchsize: unknown key"},
      {m + "train: {epochs: 1, epochs: 2}\n", {}, "t.yaml: train.epochs: given more than once"},
      // wrong types
      {m + "optimizer: {lr: fast}\n",
       {},
       "t.yaml: optimizer.lr: expected a number > 0, got 'fast'"},
      {m + "train: {batch_size: [1]}\n",
       {},
       "t.yaml: train.batch_size: expected an integer >= 1, got a list"},
      {m + "train: {batch_size: 1.5}\n", {}, "t.yaml: train.batch_size: expected an integer >= 1"},
      {m + "optimizer: 3\n", {}, "t.yaml: optimizer: expected a map {name, lr, ...}, got '3'"},
      {m + "optimizer: {nesterov: maybe}\n",
       {},
       "t.yaml: optimizer.nesterov: expected true or false, got 'maybe'"},
      {m + "job: {a: 1}\n", {}, "t.yaml: job: expected a non-empty string, got a map"},
      {m + "job: a/b\n", {}, "t.yaml: job: expected a name of letters"},
      {"- 1\n- 2\n", {}, "t.yaml: expected a map of settings"},
      {"ps: [{host: a, port: 1}]\nworkers: many\n",
       {},
       "t.yaml: workers: expected a non-empty list"},
      // out of range
      {m + "optimizer: {lr: 0}\n", {}, "t.yaml: optimizer.lr: expected a number > 0, got '0'"},
      {m + "optimizer: {lr: .nan}\n", {}, "t.yaml: optimizer.lr: expected a number > 0"},
      {m + "optimizer: {momentum: 1}\n",
       {},
       "t.yaml: optimizer.momentum: expected a number in [0, 1), got '1'"},
      {m + "optimizer: {beta2: -0.1}\n",
       {},
       "t.yaml: optimizer.beta2: expected a number in [0, 1)"},
      {m + "train: {batch_size: 0}\n",
       {},
       "t.yaml: train.batch_size: expected an integer >= 1, got '0'"},
      {m + "train: {threads: -1}\n",
       {},
       "t.yaml: train.threads: expected an integer >= 1, got '-1'"},
      {m + "train: {epochs: 0}\n", {}, "t.yaml: train.epochs: expected a number > 0"},
      {m + "train: {straggler_worker: 2}\n",
       {},
       "t.yaml: train.straggler_worker: 2 is not a worker index (there are 2 workers"},
      {m + "train: {straggler_worker: -2}\n",
       {},
       "t.yaml: train.straggler_worker: expected an integer >= -1, got '-2'"},
      {m + "train: {straggler_pause_probability: 1.5}\n",
       {},
       "t.yaml: train.straggler_pause_probability: expected a number in 0..1, got '1.5'"},
      {m + "train: {straggler_jitter_ms: -1}\n",
       {},
       "t.yaml: train.straggler_jitter_ms: expected a number >= 0, got '-1'"},
      {m + "net: {chunk_bytes: 2}\n",
       {},
       "t.yaml: net.chunk_bytes: expected an integer in 4..16777216"},
      {m + "net: {chunk_bytes: 16777217}\n",
       {},
       "t.yaml: net.chunk_bytes: expected an integer in 4..16777216"},
      {m + "net: {heartbeat: 5, worker_timeout: 5}\n",
       {},
       "t.yaml: net.heartbeat: must be shorter than net.worker_timeout (5 s)"},
      {m + "net: {gloo_base_port: 9000}\n", {}, "t.yaml: net.gloo_base_port: unknown key"},
      {m + "net: {request_timeout: 0}\n", {}, "t.yaml: net.request_timeout: expected a number > 0"},
      {m, {"workers.count=0"}, "t.yaml: workers.count: expected an integer in 1..65535, got '0'"},
      {"ps: [{host: a, port: 1}]\nworkers: [{gpu: -1}]\n",
       {},
       "t.yaml: workers.0.gpu: expected an integer >= 0, got '-1'"},
      // ps
      {"workers: {count: 1}\n", {}, "t.yaml: ps: missing"},
      {"ps: []\nworkers: {count: 1}\n",
       {},
       "t.yaml: ps: expected a non-empty list of {host, port} or {count: N}, got a list"},
      {"ps: 127.0.0.1:7000\nworkers: {count: 1}\n", {}, "t.yaml: ps: expected a non-empty list"},
      {"ps: [{host: a}]\nworkers: {count: 1}\n", {}, "t.yaml: ps.0.port: missing"},
      {"ps: [{port: 1}]\nworkers: {count: 1}\n", {}, "t.yaml: ps.0.host: missing"},
      {"ps: [{host: a, port: 0}]\nworkers: {count: 1}\n",
       {},
       "t.yaml: ps.0.port: expected an integer in 1..65535, got '0'"},
      {"ps: [{host: a, port: 65536}]\nworkers: {count: 1}\n",
       {},
       "t.yaml: ps.0.port: expected an integer in 1..65535, got '65536'"},
      {"ps: [{host: a, port: http}]\nworkers: {count: 1}\n",
       {},
       "t.yaml: ps.0.port: expected an integer"},
      {"ps: [{host: a, port: 5}, {host: b, port: 5}, {host: a, port: 5}]\nworkers: {count: 1}\n",
       {},
       "t.yaml: ps.2: duplicate endpoint a:5 (also ps.0)"},
      {"ps: [{host: '', port: 5}]\nworkers: {count: 1}\n",
       {},
       "t.yaml: ps.0.host: expected a non-empty string"},
      // workers
      {"ps: [{host: a, port: 1}]\n", {}, "t.yaml: workers: missing"},
      {"ps: [{host: a, port: 1}]\nworkers: []\n", {}, "t.yaml: workers: expected a non-empty list"},
      {"ps: [{host: a, port: 1}]\nworkers: [{device: gpu}]\n",
       {},
       "t.yaml: workers.0.device: expected cpu, cuda, auto or emulated, got 'gpu'"},
      {m,
       {"workers.device=tpu"},
       "t.yaml: workers.device: expected cpu, cuda, auto or emulated, got 'tpu'"},
      // enumerations
      {m + "mode: lazy\n",
       {},
       "t.yaml: mode: expected async, sync, ssp, backup or local, got 'lazy'"},
      {m + "optimizer: {name: rmsprop}\n",
       {},
       "t.yaml: optimizer.name: expected sgd, momentum, adam or adagrad, got 'rmsprop'"},
      {m + "data: {name: cifar}\n",
       {},
       "t.yaml: data.name: expected fashion-mnist, synthetic, synthetic-ids, criteo or "
       "synthetic-ctr, got 'cifar'"},
      {m + "data: {test_fraction: 1}\n",
       {},
       "t.yaml: data.test_fraction: expected a number in [0, 1), got '1'"},
      {m + "data: {block_lines: 0}\n",
       {},
       "t.yaml: data.block_lines: expected an integer >= 1, got '0'"},
      {m + "data: {train: ''}\n", {}, "t.yaml: data.train: expected a non-empty string"},
      {m + "data: {synthetic_ctr: {click_rate: 1}}\n",
       {},
       "t.yaml: data.synthetic_ctr.click_rate: expected a number in (0, 1), got '1'"},
      {m + "data: {synthetic_ctr: {zipf_s: 0}}\n",
       {},
       "t.yaml: data.synthetic_ctr.zipf_s: expected a number > 0, got '0'"},
      {m + "data: {synthetic_ctr: {vocab: 3}}\n",
       {},
       "t.yaml: data.synthetic_ctr.vocab: unknown key"},
      {m + "data: {name: criteo, test: /t.tsv}\n",
       {},
       "t.yaml: data.train: missing (data.name criteo reads its training set from this file"},
      {m + "data: {name: criteo, train: /t.tsv}\n",
       {},
       "t.yaml: data.test: missing (data.name criteo needs a test file, or data.test_fraction > "
       "0"},
      {m + "model: resnet\n",
       {},
       "t.yaml: model: expected mlp, cnn, dlrm or wide_deep, got 'resnet'"},
      {m + "model: custom\n",
       {},
       "t.yaml: model: expected mlp, cnn, dlrm or wide_deep, got 'custom'"},
      {m + "model: []\n",
       {},
       "t.yaml: model: expected mlp, cnn, dlrm, wide_deep or a non-empty list of layers"},
      {m + "model: [{type: dense, units: 3}, {type: softmax}]\n",
       {},
       "t.yaml: model.1.type: expected dense, relu, conv2d, maxpool2d, flatten, concat, "
       "dot_interaction, embedding or embedding_bag, got 'softmax'"},
      {m + "model: [{type: concat}]\n",
       {},
       "t.yaml: model.0.inputs: missing (required for a concat layer: the layers it joins)"},
      {m + "model: [{type: embedding, table: t, ids: 2, inputs: [x]}]\n",
       {},
       "t.yaml: model.0.inputs: unknown key"},
      {m + "model: [{type: embedding, table: t, ids: 2, first_id: 70000}]\n",
       {},
       "t.yaml: model.0.first_id: expected an integer in 0..65535, got '70000'"},
      {m + "model: {preset: dlrm, layers: []}\n",
       {},
       "t.yaml: model: give either preset or layers"},
      {m + "model: {loss: bce}\n", {}, "t.yaml: model.preset: missing (a preset, or layers"},
      {m + "model: {preset: dlrm, bottom_mlp: [0]}\n",
       {},
       "t.yaml: model.bottom_mlp.0: expected an integer >= 1, got '0'"},
      {m + "model: {preset: dlrm, loss: hinge}\n",
       {},
       "t.yaml: model.loss: expected auto, softmax or bce, got 'hinge'"},
      {m + "model: {preset: dlrm, embedding_dim: 8}\ntables: [{name: ctr_embeddings, dim: 4}]\n",
       {},
       "t.yaml: tables.0.dim: the dlrm model looks up rows of 8 floats in table "
       "'ctr_embeddings', got 4"},
      {m + "model: [{units: 3}]\n", {}, "t.yaml: model.0: expected a layer {type: "},
      {m + "model: [{type: dense}]\n",
       {},
       "t.yaml: model.0.units: missing (required for a dense layer)"},
      {m + "model: [{type: conv2d, filters: 0, kernel: 3}]\n",
       {},
       "t.yaml: model.0.filters: expected an integer >= 1, got '0'"},
      // YAML syntax, in the file and in overrides
      {"ps: [{host: a, port: 1}]\nworkers: {count: 1\njob: x\n", {}, "t.yaml:3:"},
      {m, {"foo"}, "--set 'foo': expected key=value (e.g. optimizer.lr=0.05)"},
      {m, {"=3"}, "--set '=3': expected key=value"},
      {m, {"train..seed=3"}, "--set 'train..seed=3': empty part in the key"},
      {m, {"job=[x"}, "--set 'job=[x': the value is not valid YAML"},
      {m,
       {"ps.5.port=1"},
       "--set 'ps.5.port=1': ps is a list of 2 entries; '5' is not an index of it"},
      {m, {"ps.host=x"}, "--set 'ps.host=x': ps is a list of 2 entries; 'host' is not an index"},
      {m + "job: x\n", {"job.name=y"}, "--set 'job.name=y': job is a single value"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    INFO(c.expected);
    const std::string message = error_of(c.text, c.overrides);
    CHECK(message.find(c.expected) == 0);
  }
}

TEST_CASE("config: criteo and synthetic-ctr data") {
  const auto c = parse(kMinimal);
  CHECK(c.data.train.empty());
  CHECK(c.data.test.empty());
  CHECK(c.data.test_fraction == 0);
  CHECK_FALSE(c.data.skip_bad_lines);
  CHECK(c.data.log_integers);
  CHECK(c.data.block_lines == 4096);
  CHECK(c.data.synthetic_ctr.seed == 1);
  CHECK(c.data.synthetic_ctr.vocab_scale == 1);
  CHECK(c.data.synthetic_ctr.zipf_s == 1.1);
  CHECK(c.data.synthetic_ctr.click_rate == 0.25);
  // The keys only criteo or synthetic-ctr read are written for those only:
  // other runs keep their hash.
  for (const char* key : {"\n  train:", "\n  test:", "test_fraction", "skip_bad_lines",
                          "log_integers", "block_lines", "synthetic_ctr"}) {
    CAPTURE(key);
    CHECK(c.to_yaml().find(key) == std::string::npos);
    CHECK(parse(kMinimal, {"data.name=synthetic", "data.block_lines=3", "data.test=/t"})
              .to_yaml()
              .find(key) == std::string::npos);
  }
  // ... and every value of theirs counts in the hash there.
  const std::vector<std::string> criteo_base = {"data.name=criteo", "data.train=/x.tsv",
                                                "data.test=/y.tsv"};
  const std::vector<std::string> ctr_base = {"data.name=synthetic-ctr"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> changes = {
      {criteo_base, "data.train=/z.tsv"},
      {criteo_base, "data.test=/z.tsv"},
      {criteo_base, "data.test_fraction=0.1"},
      {criteo_base, "data.skip_bad_lines=true"},
      {criteo_base, "data.log_integers=false"},
      {criteo_base, "data.block_lines=8"},
      {ctr_base, "data.log_integers=false"},
      {ctr_base, "data.synthetic_ctr.seed=2"},
      {ctr_base, "data.synthetic_ctr.vocab_scale=0.5"},
      {ctr_base, "data.synthetic_ctr.zipf_s=1.2"},
      {ctr_base, "data.synthetic_ctr.click_rate=0.5"},
  };
  for (const auto& [base, change] : changes) {
    CAPTURE(change);
    auto changed = base;
    changed.push_back(change);
    CHECK(parse(kMinimal, changed).hash() != parse(kMinimal, base).hash());
    CHECK(parse(parse(kMinimal, changed).to_yaml()).hash() == parse(kMinimal, changed).hash());
  }

  const auto criteo = parse(kMinimal, {"data.name=criteo", "data.train=/d/train.txt",
                                       "data.test=/d/test.txt", "data.skip_bad_lines=true"});
  CHECK(criteo.data.name == "criteo");
  CHECK(criteo.data.train == "/d/train.txt");
  CHECK(criteo.data.test == "/d/test.txt");
  CHECK(criteo.data.skip_bad_lines);
  const auto again = parse(criteo.to_yaml());
  CHECK(again.data.train == "/d/train.txt");
  CHECK(again.data.test == "/d/test.txt");
  // A held-out fraction of the training file stands in for data.test.
  const auto held_out =
      parse(kMinimal, {"data.name=criteo", "data.train=/d/train.txt", "data.test_fraction=0.1"});
  CHECK(held_out.data.test_fraction == 0.1);
  CHECK(held_out.data.test.empty());
  // The files are checked only for criteo.
  CHECK(parse(kMinimal, {"data.name=synthetic-ctr", "data.synthetic_ctr.seed=9"})
            .data.synthetic_ctr.seed == 9);
  CHECK(error_of(kMinimal, {"data.name=criteo"}).find("t.yaml: data.train: missing") == 0);
}

TEST_CASE("config: the YAML syntax error names the file and line") {
  const std::string message = error_of("ps:\n  - {host: a, port: 1\nworkers: 2\n");
  CHECK(message.find("t.yaml:3:") == 0);
  CHECK(message.find("YAML syntax error") != std::string::npos);
}

TEST_CASE("config: load_config names the file it cannot read") {
  TempDir dir;
  const auto missing = dir.path() / "nope.yaml";
  CHECK_THROWS_WITH_AS(
      load_config(missing),
      (missing.string() + ": no such file (give the cluster file with --cluster)").c_str(),
      ConfigError);
  CHECK_THROWS_WITH_AS(load_config(dir.path()),
                       (dir.path().string() + ": is a directory, expected a YAML file").c_str(),
                       ConfigError);
  const auto bad = dir.path() / "bad.yaml";
  std::ofstream(bad) << kMinimal << "optimizer: {lr: fast}\n";
  CHECK_THROWS_WITH_AS(load_config(bad),
                       (bad.string() + ": optimizer.lr: expected a number > 0, got 'fast'").c_str(),
                       ConfigError);
  const auto good = dir.path() / "good.yaml";
  std::ofstream(good) << kMinimal;
  CHECK(load_config(good, {"train.seed=5"}).train.seed == 5);
}

TEST_CASE("config: config_keys lists every key of the tables once") {
  const auto keys = config_keys();
  CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == keys.size());
  for (const char* key : {"job",
                          "run_dir",
                          "mode",
                          "ps",
                          "ps.N.host",
                          "ps.N.port",
                          "ps.N.bind",
                          "workers",
                          "workers.N.gpu",
                          "workers.count",
                          "workers.device",
                          "optimizer.name",
                          "optimizer.weight_decay",
                          "model",
                          "model.N.type",
                          "model.N.kernel",
                          "data.dir",
                          "train.seed",
                          "train.bucket_bytes",
                          "net.chunk_bytes",
                          "net.heartbeat"}) {
    INFO(key);
    CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
  }
  // Sections and lists appear by their keys, not as keys of their own.
  CHECK(std::find(keys.begin(), keys.end(), "train") == keys.end());
}

TEST_CASE("config: docs/config.md documents every key") {
  const auto path = std::filesystem::path(PSTRAIN_SOURCE_DIR) / "docs" / "config.md";
  std::ifstream in(path);
  REQUIRE(in);
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& key : config_keys()) {
    INFO("docs/config.md does not mention `" << key << "`");
    CHECK(doc.find("`" + key + "`") != std::string::npos);
  }
}

TEST_CASE("config: metrics ports follow the ps list, and must fit and miss the servers") {
  const auto c = parse(kMinimal, {"metrics.enabled=true", "metrics.port_base=9000"});
  CHECK(c.metrics.enabled);
  CHECK(c.metrics.linger_s == 0);
  CHECK(metrics_port(c, true, 0) == 9000);
  CHECK(metrics_port(c, true, 1) == 9001);
  CHECK(metrics_port(c, false, 0) == 9002);
  CHECK(metrics_port(c, false, 1) == 9003);
  CHECK(error_of(kMinimal, {"metrics.enabled=true", "metrics.port_base=65533"}) ==
        "t.yaml: metrics.port_base: port_base + 3 (one port per ps and worker) must be at most "
        "65535");
  CHECK(error_of(kMinimal, {"metrics.enabled=true", "metrics.port_base=6998"}) ==
        "t.yaml: metrics.port_base: the metrics ports 6998..7001 include ps 0's port 7000");
  // Off, the ports are not used and not checked.
  CHECK(error_of(kMinimal, {"metrics.port_base=6998"}).empty());
  CHECK(error_of(kMinimal, {"metrics.linger_s=-1"}).find("metrics.linger_s") != std::string::npos);
}

TEST_CASE("config: net.wire_dtype and optimizer.apply_threads") {
  const auto c = parse(kMinimal);
  CHECK(c.net.wire_dtype == WireDType::fp32);
  CHECK(c.optimizer.apply_threads == 0);  // auto
  CHECK(parse(kMinimal, {"net.wire_dtype=bf16"}).net.wire_dtype == WireDType::bf16);
  CHECK(parse(kMinimal, {"net.wire_dtype=fp16"}).net.wire_dtype == WireDType::fp16);
  CHECK(error_of(kMinimal, {"net.wire_dtype=int8"}).find("net.wire_dtype") != std::string::npos);
  const auto four = parse(kMinimal, {"optimizer.apply_threads=4"});
  CHECK(four.optimizer.apply_threads == 4);
  CHECK(parse(four.to_yaml()).optimizer.apply_threads == 4);
  CHECK(c.to_yaml().find("apply_threads: auto") != std::string::npos);
  CHECK(error_of(kMinimal, {"optimizer.apply_threads=0"}).find("optimizer.apply_threads") !=
        std::string::npos);
}

TEST_CASE("config: apply_threads auto takes the cores the host's processes leave over") {
  // 2 ps and 2 single-threaded workers on 127.0.0.1.
  const auto c = parse(kMinimal);
  CHECK(ps_apply_threads(c, 0, 2) == 1);  // 4 processes on 2 cores: nothing to spare
  CHECK(ps_apply_threads(c, 0, 4) == 1);  // exactly used
  CHECK(ps_apply_threads(c, 0, 8) == 3);  // 4 spare, 2 each
  CHECK(ps_apply_threads(c, 1, 9) == 3);  // 5 spare: the odd core is left idle
  // Workers of 3 BLAS threads each take 3 cores.
  CHECK(ps_apply_threads(parse(kMinimal, {"train.threads=3"}), 0, 12) == 3);
  // Workers elsewhere leave the host to the ps.
  const auto apart = parse(
      "ps: [{host: 10.0.0.1, port: 7000}]\n"
      "workers: {count: 2, host: 10.0.0.2}\n");
  CHECK(ps_apply_threads(apart, 0, 16) == 16);
  CHECK(ps_apply_threads(parse(kMinimal, {"optimizer.apply_threads=5"}), 0, 2) == 5);
}

}  // namespace pstrain
