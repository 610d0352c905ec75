// Asynchronous training end to end with the real binary: accuracy on
// Fashion-MNIST (at fp32 and bf16; fp16's fallback on the CPU), determinism of a single worker, a
// missing data directory, a worker killed mid-run (train.on_worker_loss continue and fail), steps
// and a final evaluation longer than net.worker_timeout, and restarts: a ps
// restored from its checkpoint, one restarted without it, and a worker
// that resumes its shard.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/child_process.h"
#include "tests/support/pstrain_binary.h"
#include "tests/support/raw_peer.h"

using namespace pstrain;
using namespace std::chrono_literals;

namespace {

struct Run {
  TempDir dir;
  std::filesystem::path cluster;
  int n_ps, n_workers;
  std::vector<std::unique_ptr<ChildProcess>> ps, workers;

  Run(int n_ps_, int n_workers_, const std::string& extra) : n_ps(n_ps_), n_workers(n_workers_) {
    std::ostringstream y;
    y << "job: train-test\nrun_dir: " << (dir.path() / "run").string() << "\nps:\n";
    for (int i = 0; i < n_ps; ++i) y << "  - {host: 127.0.0.1, port: " << free_port() << "}\n";
    y << "workers: {count: " << n_workers << "}\n" << extra;
    cluster = dir.path() / "cluster.yaml";
    std::ofstream(cluster) << y.str();
  }

  std::vector<std::string> argv(const std::string& role, int index) const {
    return {pstrain::testing::pstrain_binary(),
            "--role",
            role,
            "--index",
            std::to_string(index),
            "--cluster",
            cluster.string()};
  }
  void start_ps(const std::vector<std::string>& ps_extra = {}) {
    for (int i = 0; i < n_ps; ++i) {
      auto args = argv("ps", i);
      args.insert(args.end(), ps_extra.begin(), ps_extra.end());
      ps.push_back(
          std::make_unique<ChildProcess>(args, dir.path() / ("ps" + std::to_string(i) + ".out")));
    }
  }
  void start_workers() {
    for (int i = 0; i < n_workers; ++i)
      workers.push_back(std::make_unique<ChildProcess>(
          argv("worker", i), dir.path() / ("worker" + std::to_string(i) + ".out")));
  }
  void start(const std::vector<std::string>& ps_extra = {}) {
    start_ps(ps_extra);
    start_workers();
  }
  // Waits for every process; returns false (with the logs) on a timeout.
  bool finish(std::chrono::seconds timeout, std::string& logs) {
    bool ok = true;
    for (auto* group : {&workers, &ps})
      for (auto& c : *group)
        if (!c->wait_for(timeout)) ok = false;
    for (auto* group : {&workers, &ps})
      for (auto& c : *group) logs += c->log_text();
    return ok;
  }
  // Starts every process and requires that they all end and worker 0
  // succeeds; returns every process's output.
  std::string train(std::chrono::seconds timeout, const std::vector<std::string>& ps_extra = {}) {
    start(ps_extra);
    return require_success(timeout);
  }
  // Requires that the started processes all end and worker 0 succeeds.
  std::string require_success(std::chrono::seconds timeout) {
    std::string logs;
    REQUIRE_MESSAGE(finish(timeout, logs), logs);
    REQUIRE_MESSAGE(workers[0]->wait_for(0s) == 0, logs);
    return logs;
  }
  std::filesystem::path run_dir() const { return dir.path() / "run"; }
};

double final_accuracy(const std::string& worker0_output) {
  std::smatch m;
  static const std::regex re("final test accuracy ([0-9.]+)");
  return std::regex_search(worker0_output, m, re) ? std::stod(m[1]) : -1;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("async: 2 ps + 2 workers train the MLP to at least 80% in one epoch") {
  Run run(2, 2,
          "model: mlp\n"
          "optimizer: {name: momentum, lr: 0.02, momentum: 0.9}\n"
          "train: {epochs: 1, eval_every: 0}\n");
  const std::string logs = run.train(120s);
  for (auto& w : run.workers) CHECK_MESSAGE(w->wait_for(0s) == 0, logs);
  for (auto& p : run.ps) CHECK_MESSAGE(p->wait_for(0s) == 0, logs);
  const double accuracy = final_accuracy(run.workers[0]->log_text());
  MESSAGE("final test accuracy ", accuracy);
  CHECK_MESSAGE(accuracy >= 0.80, logs);
  CHECK(std::filesystem::exists(run.run_dir() / "model.bin"));
  CHECK(std::filesystem::exists(run.run_dir() / "worker0.metrics.jsonl"));

  // The saved model scores the same on its own.
  ChildProcess eval({pstrain::testing::pstrain_binary(), "--role", "eval", "--model",
                     (run.run_dir() / "model.bin").string(), "--cluster", run.cluster.string()},
                    run.dir.path() / "eval.out");
  REQUIRE(eval.wait_for(60s) == 0);
  std::smatch m;
  const std::string out = eval.log_text();
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("test accuracy ([0-9.]+)")), out);
  CHECK(std::abs(std::stod(m[1]) - accuracy) < 1e-4);
}

TEST_CASE("async: embedding layers in the model's list train on synthetic-ids through 2 ps") {
  // The bag with the next batch's rows prefetched (one update stale).
  using Case = std::pair<std::string, std::string>;  // a layer, more train keys
  for (const Case& c :
       {Case{"{type: embedding, table: ids, ids: 3}", ""},
        Case{"{type: embedding_bag, table: ids, ids: 3, pool: mean}", ", prefetch: 1"}}) {
    const std::string& layer = c.first;
    const std::string& train = c.second;
    CAPTURE(layer);
    CAPTURE(train);
    Run run(2, 2,
            "tables: [{name: ids, dim: 8, rows: dynamic}]\n"
            "optimizer: {name: sgd, lr: 0.1, sparse: {name: adagrad, lr: 0.1}}\n"
            "model: [" +
                layer +
                ", {type: dense, units: 16}, {type: relu}, {type: dense, units: 2}]\n"
                "data: {name: synthetic-ids, synthetic_train: 40000, synthetic_test: 2000}\n"
                "train: {epochs: 2, eval_every: 0" +
                train + "}\n");
    const std::string logs = run.train(180s);
    for (auto& w : run.workers) CHECK_MESSAGE(w->wait_for(0s) == 0, logs);
    const double accuracy = final_accuracy(run.workers[0]->log_text());
    MESSAGE(layer, ": final test accuracy ", accuracy);
    CHECK_MESSAGE(accuracy >= 0.9, logs);
  }
}

double final_auc(const std::string& worker0_output, double* ceiling) {
  std::smatch m;
  static const std::regex re(
      "final test AUC ([0-9.]+), logloss [0-9.]+ \\(the data's teacher: AUC ([0-9.]+)");
  if (!std::regex_search(worker0_output, m, re)) return -1;
  *ceiling = std::stod(m[2]);
  return std::stod(m[1]);
}

TEST_CASE("every mode trains DLRM on synthetic-ctr: AUC at least 0.68 in one epoch") {
  // The rows go through the ps in every mode; sync and local all-reduce the
  // dense layers meanwhile (docs/modes.md). 0.5 is a coin; the teacher,
  // the best any model can do on these samples, has about 0.74.
  for (const std::string mode : {"async", "sync", "ssp", "backup", "local"}) {
    CAPTURE(mode);
    Run run(2, 2,
            "mode: " + mode +
                "\n"
                "model: {preset: dlrm, embedding_dim: 16, bottom_mlp: [64], top_mlp: [64]}\n"
                "optimizer: {name: adam, lr: 0.002, sparse: {name: adagrad, lr: 0.05}}\n"
                "data: {name: synthetic-ctr, synthetic_train: 60000, synthetic_test: 10000,\n"
                "       synthetic_ctr: {vocab_scale: 0.001}}\n"
                "train: {batch_size: 128, epochs: 1, eval_every: 0}\n");
    const std::string logs = run.train(180s);
    for (auto& w : run.workers) CHECK_MESSAGE(w->wait_for(0s) == 0, logs);
    double ceiling = 0;
    const double auc = final_auc(run.workers[0]->log_text(), &ceiling);
    MESSAGE(mode, ": final test AUC ", auc, " (the teacher's ", ceiling, ")");
    CHECK_MESSAGE(auc >= 0.68, logs);
    CHECK(ceiling > auc);
  }
}

TEST_CASE("async: the default job at train.precision bf16 reaches 85% in its 3 epochs") {
  // cluster.yaml's training; the CPU computes bf16 everywhere (emulated
  // where OpenBLAS lacks cblas_sbgemm), so this never skips.
  Run run(2, 2,
          "model: mlp\n"
          "optimizer: {name: momentum, lr: 0.02, momentum: 0.9, nesterov: true}\n"
          "train: {batch_size: 64, epochs: 3, eval_every: 0, precision: bf16}\n");
  const std::string logs = run.train(300s);
  for (auto& w : run.workers) CHECK_MESSAGE(w->wait_for(0s) == 0, logs);
  const std::string worker0 = run.workers[0]->log_text();
  CHECK_MESSAGE(worker0.find("cpu: bf16 GEMMs") != std::string::npos, worker0);
  CHECK_MESSAGE(worker0.find("precision bf16") != std::string::npos, worker0);
  const double accuracy = final_accuracy(worker0);
  MESSAGE("final test accuracy at bf16 ", accuracy);
  CHECK_MESSAGE(accuracy >= 0.85, logs);
}

TEST_CASE("async: train.precision fp16 on the CPU says it is unavailable and trains in fp32") {
  Run run(1, 1, "data: {name: synthetic}\ntrain: {epochs: 1, eval_every: 0, precision: fp16}\n");
  const std::string logs = run.train(120s);
  const std::string worker0 = run.workers[0]->log_text();
  CHECK_MESSAGE(worker0.find("train.precision=fp16 is not available on cpu") != std::string::npos,
                worker0);
  CHECK_MESSAGE(worker0.find("; training in fp32") != std::string::npos, worker0);
  CHECK_MESSAGE(worker0.find("precision fp32") != std::string::npos, worker0);
}

// cluster.yaml's job (2 ps + 2 workers, the MLP, Nesterov momentum, 3
// epochs) with `optimizer` added to its optimizer's keys and `rest` to the
// file; checks worker 0's final test accuracy against `at_least`.
void check_default_job(const std::string& optimizer, const std::string& rest, double at_least) {
  Run run(2, 2,
          "model: mlp\n"
          "optimizer: {name: momentum, lr: 0.02, momentum: 0.9, nesterov: true" +
              optimizer + "}\n" + rest);
  const std::string logs = run.train(300s);
  const double accuracy = final_accuracy(run.workers[0]->log_text());
  MESSAGE("final test accuracy ", accuracy);
  CHECK_MESSAGE(accuracy >= at_least, logs);
}

TEST_CASE("async: the default job with bf16 weights and gradients on the wire reaches 85%") {
  check_default_job("", "train: {epochs: 3, eval_every: 0}\nnet: {wire_dtype: bf16}\n", 0.85);
}

TEST_CASE("async: the default job with top-k compression reaches 85% on a tenth of the bytes") {
  // net.compression topk:0.05 with error feedback: 5% of each chunk's
  // elements at 8 bytes each, so 10% of float32's gradient bytes (and a
  // 4-byte count a chunk, and at least one element of the smallest
  // variables). topk:0.01 measured 0.84 to 0.86 here: too close to call.
  Run run(2, 2,
          "model: mlp\n"
          "optimizer: {name: momentum, lr: 0.02, momentum: 0.9, nesterov: true}\n"
          "train: {epochs: 3, eval_every: 0}\nnet: {compression: 'topk:0.05'}\n");
  const std::string logs = run.train(300s);
  const double accuracy = final_accuracy(run.workers[0]->log_text());
  MESSAGE("final test accuracy with top-k 5% ", accuracy);
  CHECK_MESSAGE(accuracy >= 0.85, logs);
  for (int w = 0; w < 2; ++w) {
    const std::string metrics =
        read_file(run.run_dir() / ("worker" + std::to_string(w) + ".metrics.jsonl"));
    static const std::regex pushed(R"re("push_bytes":(\d+),"push_bytes_float32":(\d+))re");
    std::uint64_t sent = 0, float32 = 0;
    for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), pushed);
         it != std::sregex_iterator(); ++it) {
      sent = std::stoull((*it)[1]);
      float32 = std::stoull((*it)[2]);
    }
    REQUIRE(float32 > 0);
    const double share = static_cast<double>(sent) / static_cast<double>(float32);
    MESSAGE("worker ", w, " sent ", sent, " bytes of gradients, ", share, " of float32's");
    CHECK(share <= 0.101);
  }
}

TEST_CASE("async: the default job pipelined (train.pipeline 1, staleness_lr) reaches 84%") {
  // Each update one step staler costs accuracy per sample; the weights a
  // step computes on, predicted one step on (train.weight_prediction 1),
  // win most of it back: 0.848 to 0.859 here in 3 epochs (0.819 to 0.859
  // without the prediction), against 0.86 to 0.87 unpipelined
  // (docs/performance.md).
  check_default_job(", staleness_lr: true", "train: {epochs: 3, eval_every: 0, pipeline: 1}\n",
                    0.84);
}

TEST_CASE("async: a pipelined step reads its replies where they came and keeps none past it") {
  // train.pipeline: a step's replies stay in their ZeroMQ messages until
  // the landing at the end of the next step reads them into the model
  // (client/ps/received_values.h). After each landing only the step in
  // flight may hold any: at most the MLP's 9 chunks (dense0/w in 4, and
  // 5 more variables), not the landed step's as well. 16-bit values on the
  // wire are widened on arrival, so none is kept.
  for (const std::string wire : {"fp32", "bf16"}) {
    CAPTURE(wire);
    Run run(2, 1,
            "data: {name: synthetic, synthetic_train: 6400, synthetic_test: 200}\n"
            "net: {heartbeat: 0.05, wire_dtype: " +
                wire +
                "}\n"
                "train: {batch_size: 32, epochs: 1, eval_every: 0, pipeline: 1}\n");
    run.train(60s);
    const std::string metrics = read_file(run.run_dir() / "worker0.metrics.jsonl");
    static const std::regex kept_re("\"kept_messages\":([0-9.e-]+)");
    double most = -1;
    for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), kept_re);
         it != std::sregex_iterator(); ++it)
      most = std::max(most, std::stod((*it)[1]));
    INFO(metrics);
    if (wire == "fp32") {
      CHECK(most >= 1);
      CHECK(most <= 9);
    } else {
      CHECK(most == 0);
    }
  }
}

TEST_CASE("async: a pipelined step computes on the weights one update old, and says so") {
  // One worker: without the pipeline each push is computed on the weights
  // its chunk has (staleness 0); pipelined, each is computed on the weights
  // from before the worker's own previous update (staleness exactly 1, but
  // for the first two steps), which the pushes' versions must carry to the ps.
  for (const int pipeline : {0, 1}) {
    CAPTURE(pipeline);
    Run run(2, 1,
            "data: {name: synthetic, synthetic_train: 3200, synthetic_test: 200}\n"
            "net: {heartbeat: 0.05}\n"
            "train: {batch_size: 32, epochs: 1, eval_every: 0, pipeline: " +
                std::to_string(pipeline) + "}\n");
    run.train(60s);
    const std::string metrics = read_file(run.run_dir() / "worker0.metrics.jsonl");
    std::set<std::string> means, maxima;
    static const std::regex mean_re("\"staleness\":([0-9.e-]+)"),
        max_re("\"max_staleness\":([0-9.e-]+)");
    for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), mean_re);
         it != std::sregex_iterator(); ++it)
      means.insert((*it)[1]);
    for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), max_re);
         it != std::sregex_iterator(); ++it)
      maxima.insert((*it)[1]);
    INFO(metrics);
    REQUIRE_FALSE(maxima.empty());
    if (!pipeline) {
      CHECK(maxima == std::set<std::string>{"0"});
      CHECK(means == std::set<std::string>{"0"});
    } else {
      // The first two steps report 0 (nothing was landed before step 1's
      // push); every later one 1. A window may hold only those first two.
      CHECK(maxima.contains("1"));
      CHECK(std::ranges::includes(std::set<std::string>{"0", "1"}, maxima));
      CHECK(means.contains("1"));
    }
  }
}

TEST_CASE("async: 1 ps + 2 workers take role, index and hosts from TF_CONFIG alone") {
  TempDir dir;
  const auto cluster = dir.path() / "cluster.yaml";
  std::ofstream(cluster) << "job: tf-test\nrun_dir: " << (dir.path() / "run").string()
                         << "\nps: {count: 1, port_base: 1}\nworkers: {count: 2}\n"
                            "data: {name: synthetic, synthetic_train: 2000, synthetic_test: 500}\n"
                            "optimizer: {name: adam, lr: 0.001}\n"
                            "train: {epochs: 2, eval_every: 0}\n";
  // TFJob's form; the workers' ports are not used by an async run.
  const std::string ps = "127.0.0.1:" + std::to_string(free_port());
  const std::string spec = R"({"cluster": {"ps": [")" + ps +
                           R"("], "worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": )";
  const auto start = [&](const std::string& type, int index) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{pstrain::testing::pstrain_binary(), "--cluster", cluster.string()},
        dir.path() / (type + std::to_string(index) + ".out"),
        std::vector<std::string>{"TF_CONFIG=" + spec + R"({"type": ")" + type + R"(", "index": )" +
                                 std::to_string(index) + "}}"});
  };
  std::vector<std::unique_ptr<ChildProcess>> processes;
  processes.push_back(start("ps", 0));
  processes.push_back(start("worker", 0));
  processes.push_back(start("worker", 1));
  std::string logs;
  for (auto& p : processes) p->wait_for(120s);
  for (auto& p : processes) logs += p->log_text();
  for (auto& p : processes) CHECK_MESSAGE(p->wait_for(0s) == 0, logs);
  CHECK_MESSAGE(logs.find("placed from TF_CONFIG: worker 1") != std::string::npos, logs);
  const double accuracy = final_accuracy(processes[1]->log_text());
  MESSAGE("final test accuracy ", accuracy);
  CHECK_MESSAGE(accuracy > 0.3, logs);  // trained: chance is 0.1 on 10 classes
  // ps 0 wrote the filled hosts: the port TF_CONFIG gave, not port_base.
  CHECK(read_file(dir.path() / "run" / "config.yaml")
            .find("ps:\n  - {host: 127.0.0.1, port: " + ps.substr(10) + ",") != std::string::npos);
}

TEST_CASE("async: a single worker with a fixed seed trains bit-identically twice") {
  std::string models[2];
  for (auto& model : models) {
    Run run(2, 1,
            "data: {name: synthetic, synthetic_train: 2000, synthetic_test: 200}\n"
            "optimizer: {name: adam, lr: 0.001}\n"
            "train: {epochs: 1, seed: 7, eval_every: 0}\n");
    run.train(60s);
    model = read_file(run.run_dir() / "model.bin");
    REQUIRE(model.size() > 100000);
  }
  CHECK(models[0] == models[1]);
}

TEST_CASE("async: a missing data directory is named, with the package that provides it") {
  Run run(1, 1, "data: {dir: /nonexistent/fashion}\nnet: {worker_timeout: 2, heartbeat: 0.5}\n");
  run.start();
  const auto code = run.workers[0]->wait_for(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  const std::string out = run.workers[0]->log_text();
  CHECK_MESSAGE(out.find("/nonexistent/fashion/train-images-idx3-ubyte.gz") != std::string::npos,
                out);
  CHECK_MESSAGE(out.find("dataset-fashion-mnist") != std::string::npos, out);
}

namespace {

// Waits until `worker` is training: its metrics file has `reports` lines,
// each written after a report of its samples to the ps.
void wait_until_training(Run& run, int worker, int reports = 1) {
  const auto metrics = run.run_dir() / ("worker" + std::to_string(worker) + ".metrics.jsonl");
  const auto lines = [&] {
    const auto text = read_file(metrics);
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  };
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (lines() < reports && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  REQUIRE_MESSAGE(lines() >= reports, "worker " << worker
                                                << " wrote no metrics line in 60 s; its log:\n"
                                                << run.workers[worker]->log_text());
}

// The same, then kills it.
void kill_when_training(Run& run, int worker, int reports = 1) {
  wait_until_training(run, worker, reports);
  run.workers[worker]->kill(SIGKILL);
}

}  // namespace

TEST_CASE("async: a worker killed mid-run is absent; the others finish and the ps's exit 0") {
  Run run(2, 3,
          "data: {name: synthetic, synthetic_train: 30000, synthetic_test: 200}\n"
          "train: {epochs: 2, eval_every: 0}\n"
          "net: {worker_timeout: 2, heartbeat: 0.25, request_timeout: 5}\n");
  run.start();
  kill_when_training(run, 1);
  std::string logs;
  REQUIRE_MESSAGE(run.finish(120s, logs), logs);
  for (int w : {0, 2}) CHECK_MESSAGE(run.workers[w]->wait_for(0s) == 0, logs);
  CHECK(run.workers[1]->wait_for(0s) == 128 + SIGKILL);
  CHECK_MESSAGE(final_accuracy(run.workers[0]->log_text()) >= 0, logs);
  for (auto& p : run.ps) {
    CHECK_MESSAGE(p->wait_for(0s) == 0, logs);
    const std::string ps_log = p->log_text();
    CHECK_MESSAGE(ps_log.find("no message from worker(s) 1 for 2.0 s (net.worker_timeout); "
                              "marked absent") != std::string::npos,
                  ps_log);
    CHECK_MESSAGE(
        ps_log.find("every live worker done (0, 2), worker(s) 1 absent") != std::string::npos,
        ps_log);
  }
}

TEST_CASE("async: on_worker_loss fail: a killed worker makes the ps exit 3 naming it") {
  Run run(1, 3,
          "data: {name: synthetic, synthetic_train: 60000, synthetic_test: 200}\n"
          "train: {epochs: 3, eval_every: 0, on_worker_loss: fail}\n"
          "net: {worker_timeout: 2, heartbeat: 0.25, request_timeout: 5}\n");
  run.start();
  kill_when_training(run, 1);

  const auto ps_code = run.ps[0]->wait_for(60s);
  REQUIRE_MESSAGE(ps_code.has_value(), run.ps[0]->log_text());
  CHECK(*ps_code == 3);
  const std::string ps_log = run.ps[0]->log_text();
  CHECK_MESSAGE(ps_log.find("no message from worker(s) 1 for 2.0 s (net.worker_timeout); "
                            "exiting (train.on_worker_loss: fail)") != std::string::npos,
                ps_log);
  // The others do not hang: each ends with an error naming the silent worker
  // (parked in the barrier) or the ps that went away: once its first
  // request has timed out (net.request_timeout, 5 s), the others in flight
  // are abandoned (PsRequestsGuard), not each waited out in turn (up to six
  // here, the MLP's variables: 30 s).
  for (int w : {0, 2}) {
    const auto code = run.workers[w]->wait_for(20s);
    REQUIRE_MESSAGE(code.has_value(), run.workers[w]->log_text());
    CHECK(*code != 0);
  }
}

namespace {

// Trains `run` (1 ps, 2 workers) and requires that every process ended 0
// and the ps never took a worker for lost.
void train_without_losing_a_worker(Run& run) {
  const std::string logs = run.train(120s);
  for (auto& w : run.workers) CHECK_MESSAGE(w->wait_for(0s) == 0, logs);
  CHECK_MESSAGE(run.ps[0]->wait_for(0s) == 0, logs);
  const std::string ps_log = run.ps[0]->log_text();
  CHECK_MESSAGE(ps_log.find("no message from worker") == std::string::npos, ps_log);
  CHECK_MESSAGE(ps_log.find("all 2 workers done") != std::string::npos, ps_log);
}

}  // namespace

TEST_CASE("async: steps longer than worker_timeout do not make a worker lost") {
  // Worker 1's steps each take 2.5 s (the straggler delay) against a
  // worker_timeout of 1.5 s: only its heartbeat thread keeps it live.
  Run run(1, 2,
          "data: {name: synthetic, synthetic_train: 512, synthetic_test: 200}\n"
          "train: {epochs: 1, batch_size: 128, eval_every: 0, straggler_worker: 1, "
          "straggler_delay_ms: 2500}\n"
          "net: {worker_timeout: 1.5, heartbeat: 0.25, request_timeout: 5}\n");
  train_without_losing_a_worker(run);
  // Every sample of both workers was counted before the final evaluation.
  std::smatch m;
  const std::string out = run.workers[0]->log_text();
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("after ([0-9]+) global samples")), out);
  CHECK(std::stoull(m[1]) == 512);
}

TEST_CASE("async: a final evaluation longer than worker_timeout does not make worker 0 lost") {
  // The CNN on 12,000 test samples takes seconds on a CPU; worker 1 is done
  // long before, so without its heartbeat thread worker 0 would be the only
  // one left and silent.
  Run run(1, 2,
          "model: cnn\n"
          "data: {name: synthetic, synthetic_train: 256, synthetic_test: 12000}\n"
          "train: {epochs: 1, batch_size: 128, eval_every: 0}\n"
          "net: {worker_timeout: 1, heartbeat: 0.25, request_timeout: 5}\n");
  train_without_losing_a_worker(run);
  CHECK(final_accuracy(run.workers[0]->log_text()) >= 0);
  CHECK(std::filesystem::exists(run.run_dir() / "snapshot" / "ps0.bin"));
  // The evaluation did outlast worker_timeout, or this test shows nothing.
  std::smatch m;
  const std::string metrics = read_file(run.run_dir() / "worker0.metrics.jsonl");
  REQUIRE_MESSAGE(std::regex_search(metrics, m, std::regex("\"eval_s\":([0-9.e+-]+)")), metrics);
  CHECK(std::stod(m[1]) > 1.0);
}

TEST_CASE("async: a run continues from the snapshot the previous run left") {
  const std::string setup =
      "data: {name: synthetic, synthetic_train: 2000, synthetic_test: 500}\n"
      "optimizer: {name: adam, lr: 0.001}\n"
      "train: {epochs: 1, eval_every: 0}\n";
  Run first(2, 1, setup);
  first.train(60s);
  const auto snapshot = first.run_dir() / "snapshot";
  REQUIRE(std::filesystem::exists(snapshot / "ps0.bin"));
  REQUIRE(std::filesystem::exists(snapshot / "ps1.bin"));

  Run second(2, 1, setup);
  second.start_ps({"--restore", snapshot.string()});
  // Before any worker comes: the restored ps's hold the snapshot's weights.
  const auto mismatches =
      testing::restored_mismatches(pstrain::load_config(second.cluster), snapshot);
  CHECK_MESSAGE(mismatches.empty(), mismatches);
  second.start_workers();
  second.require_success(60s);
  // The global sample count goes on from the first run's 2,000.
  std::smatch m;
  const std::string out = second.workers[0]->log_text();
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("after ([0-9]+) global samples")), out);
  CHECK(std::stoull(m[1]) == 4000);
}

namespace {

// A run long enough to kill and restart a process in (2 epochs of 30,000
// synthetic samples), with checkpoints every 0.5 s and resends that outlast
// a restart.
const char* const kRestartRun =
    "data: {name: synthetic, synthetic_train: 30000, synthetic_test: 200}\n"
    "train: {epochs: 2, eval_every: 0}\n"
    "checkpoint: {every_s: 0.5}\n"
    "net: {worker_timeout: 5, heartbeat: 0.25, request_timeout: 15, retry_interval: 0.5}\n";

// Waits until every worker is training and ps `index` has written a
// checkpoint, then kills that ps.
void kill_ps_after_checkpoint(Run& run, int index) {
  for (int w = 0; w < run.n_workers; ++w) {
    const auto metrics = run.run_dir() / ("worker" + std::to_string(w) + ".metrics.jsonl");
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!std::filesystem::exists(metrics) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(50ms);
    REQUIRE(std::filesystem::exists(metrics));
  }
  const auto file = "ps" + std::to_string(index) + ".bin";
  const auto has_checkpoint = [&] {
    std::error_code ec;
    for (const auto& g : std::filesystem::directory_iterator(run.run_dir() / "checkpoints", ec))
      if (std::filesystem::exists(g.path() / file)) return true;
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!has_checkpoint() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  REQUIRE(has_checkpoint());
  std::this_thread::sleep_for(700ms);  // past the next checkpoint, mid-period
  run.ps[index]->kill(SIGKILL);
  REQUIRE(run.ps[index]->wait_for(10s).has_value());
}

std::uint64_t final_global_samples(const std::string& worker0_output) {
  std::smatch m;
  static const std::regex re("after ([0-9]+) global samples");
  return std::regex_search(worker0_output, m, re) ? std::stoull(m[1]) : 0;
}

}  // namespace

TEST_CASE("async: a ps killed and restarted from its checkpoint: workers re-pull, losses counted") {
  Run run(2, 2, kRestartRun);
  run.start();
  kill_ps_after_checkpoint(run, 1);
  run.ps[1] = std::make_unique<ChildProcess>(
      [&] {
        auto args = run.argv("ps", 1);
        args.insert(args.end(), {"--restore", "latest"});
        return args;
      }(),
      run.dir.path() / "ps1.restarted.out");
  const std::string logs = run.require_success(120s);
  for (auto& w : run.workers) {
    CHECK_MESSAGE(w->wait_for(0s) == 0, logs);
    CHECK_MESSAGE(w->log_text().find("ps 1 restarted (generation") != std::string::npos, logs);
  }
  for (auto& p : run.ps) CHECK_MESSAGE(p->wait_for(0s) == 0, logs);
  const std::string restarted = run.ps[1]->log_text();
  CHECK_MESSAGE(restarted.find("restored_from 0,") == std::string::npos, restarted);
  // Updates applied after the checkpoint and before the kill are gone, and
  // the ps says whose and how many.
  CHECK_MESSAGE(restarted.find("the restore lost") != std::string::npos, restarted);
  CHECK_MESSAGE(final_accuracy(run.workers[0]->log_text()) >= 0.5, logs);
}

TEST_CASE("async: a ps restarted without its checkpoint is refused, not mixed in") {
  Run run(2, 2, kRestartRun);
  run.start();
  kill_ps_after_checkpoint(run, 1);
  run.ps[1] =
      std::make_unique<ChildProcess>(run.argv("ps", 1), run.dir.path() / "ps1.restarted.out");
  for (auto& w : run.workers) {
    const auto code = w->wait_for(60s);
    REQUIRE_MESSAGE(code.has_value(), w->log_text());
    CHECK(*code != 0);
    CHECK_MESSAGE(w->log_text().find("ps 1 restarted without its checkpoint") != std::string::npos,
                  w->log_text());
  }
}

TEST_CASE("async: a restarted worker resumes its shard where ps 0 counted it") {
  Run run(1, 2, kRestartRun);
  run.start();
  kill_when_training(run, 1, 4);
  REQUIRE(run.workers[1]->wait_for(10s).has_value());
  run.workers[1] = std::make_unique<ChildProcess>(run.argv("worker", 1),
                                                  run.dir.path() / "worker1.restarted.out");
  const std::string logs = run.require_success(120s);
  CHECK_MESSAGE(run.workers[1]->wait_for(0s) == 0, logs);
  const std::string restarted = run.workers[1]->log_text();
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(restarted, m, std::regex("resuming after ([0-9]+) samples")),
                  restarted);
  CHECK(std::stoull(m[1]) > 0);
  // It rejoined at once as the new holder of index 1 (the old process was
  // killed, so silent), not refused as a second live worker.
  CHECK_MESSAGE(
      run.ps[0]->log_text().find("worker index 1 taken over by a new process") != std::string::npos,
      run.ps[0]->log_text());
  // Each worker's share of 2 epochs over 30,000 samples, trained once: only
  // the samples since the killed worker's last report are trained twice.
  const auto global = final_global_samples(run.workers[0]->log_text());
  CHECK_MESSAGE(global >= 60000, logs);
  CHECK_MESSAGE(global <= 61000, logs);
}

TEST_CASE("async: a second live worker with a taken index is refused; the run goes on") {
  // Long enough that worker 1 is still training when the second process
  // gives up asking (takeover grace: 1.5 s here): once worker 1 has said
  // done, a process taking its index is accepted, as a restart after
  // success would be.
  const char* const kLongerRun =
      "data: {name: synthetic, synthetic_train: 30000, synthetic_test: 200}\n"
      "train: {epochs: 8, eval_every: 0}\n"
      "net: {worker_timeout: 5, heartbeat: 0.25, request_timeout: 15, retry_interval: 0.5}\n";
  Run run(1, 2, kLongerRun);
  run.start();
  wait_until_training(run, 1);
  // Started by mistake beside the live worker 1 (a slip of the hand, or a
  // stale command): it is refused and exits non-zero naming why.
  ChildProcess second(run.argv("worker", 1), run.dir.path() / "worker1.second.out");
  const auto code = second.wait_for(60s);
  REQUIRE_MESSAGE(code.has_value(), second.log_text());
  CHECK_MESSAGE(*code == 1, second.log_text());
  CHECK_MESSAGE(
      second.log_text().find("worker index 1 is taken by a live process") != std::string::npos,
      second.log_text());
  // The run goes on with the first worker 1, which trains its share once.
  const std::string logs = run.require_success(120s);
  CHECK_MESSAGE(run.workers[1]->wait_for(0s) == 0, logs);
  const auto global = final_global_samples(run.workers[0]->log_text());
  CHECK_MESSAGE(global >= 240000, logs);
  CHECK_MESSAGE(global <= 240100, logs);
  CHECK_MESSAGE(run.ps[0]->log_text().find("taken over") == std::string::npos, logs);
}
