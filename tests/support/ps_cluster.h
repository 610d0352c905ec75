#pragma once
// Parameter servers for multi-process tests: a cluster.yaml on free loopback
// ports, `pstrain --role ps` children started from it, and forked client
// processes. Everything is ended by PID when it goes out of scope.
#include <doctest/doctest.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "shared/config.h"
#include "shared/curve_keys.h"
#include "tests/support/child_process.h"
#include "tests/support/pstrain_binary.h"

namespace pstrain::testing {

// The sender of the test process's own clients when forked children are the
// workers: a tool, not a worker, so it never holds a worker index the
// children need (server/coordinator.h: one process per worker index).
inline constexpr std::uint32_t kTool = 1000;

struct ClusterSpec {
  std::uint32_t ps = 1;
  std::uint32_t workers = 1;
  std::string optimizer = "sgd";
  double lr = 1;
  double worker_timeout = 60;
  std::uint64_t chunk_bytes = 64 * 1024;
  std::string on_worker_loss = {};  // train.on_worker_loss; empty: the mode's default
  std::string mode = {};            // empty: the default (async)
  std::string model = {};           // model preset; empty: the default (mlp)
  double epochs = 0;                // train.epochs; 0: the default
  std::string train = {};           // more train.* entries, as "key: value, key: value"
  double checkpoint_every_s = 60;
  std::uint32_t checkpoint_keep = 3;
  std::string checkpoint = {};  // more checkpoint.* entries, as "key: value, key: value"
  double request_timeout = 10;
  double retry_interval = 1;
  double fault_drop = 0;      // net.fault.drop, for every process of the cluster
  double fault_delay_ms = 0;  // net.fault.delay_ms, likewise
  // security.curve, with a fresh key set in <dir>/keys (shared/curve_keys.h).
  bool curve = false;
  std::string tables = {};            // `tables:` as a YAML list; empty: none
  std::string sparse_optimizer = {};  // optimizer.sparse as a YAML map; empty: the default
  std::string replication = {};       // `replication:` as a YAML map; empty: none
};

// A whole-number figure of the stats op's JSON (server/ps_stats.h names the
// keys; a nested key, "push" inside "requests", is found by its first
// occurrence); throws naming the key when the JSON lacks it.
inline std::uint64_t stat(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\":");
  if (at == std::string::npos) throw std::runtime_error("no " + key + " in " + json);
  return std::stoull(json.substr(at + key.size() + 3));
}

class PsCluster {
 public:
  explicit PsCluster(const ClusterSpec& spec) {
    std::ostringstream y;
    y << "job: pstest\nrun_dir: " << dir_.path().string() << "\nps:\n";
    for (std::uint32_t i = 0; i < spec.ps; ++i)
      y << "  - {host: 127.0.0.1, port: " << free_port() << "}\n";
    y << "workers: {count: " << spec.workers << "}\n"
      << "optimizer: {name: " << spec.optimizer << ", lr: " << spec.lr
      << (spec.sparse_optimizer.empty() ? "" : ", sparse: " + spec.sparse_optimizer) << "}\n"
      << "data: {name: synthetic}\n";
    if (!spec.tables.empty()) y << "tables: " << spec.tables << "\n";
    if (!spec.replication.empty()) y << "replication: " << spec.replication << "\n";
    if (!spec.mode.empty()) y << "mode: " << spec.mode << "\n";
    if (!spec.model.empty()) y << "model: " << spec.model << "\n";
    std::vector<std::string> train;
    if (!spec.train.empty()) train.push_back(spec.train);
    if (!spec.on_worker_loss.empty()) train.push_back("on_worker_loss: " + spec.on_worker_loss);
    if (spec.epochs > 0) train.push_back("epochs: " + std::to_string(spec.epochs));
    if (!train.empty()) {
      y << "train: {";
      for (std::size_t i = 0; i < train.size(); ++i) y << (i ? ", " : "") << train[i];
      y << "}\n";
    }
    y << "net: {chunk_bytes: " << spec.chunk_bytes << ", worker_timeout: " << spec.worker_timeout
      << ", heartbeat: " << std::min(1.0, spec.worker_timeout / 2)
      << ", request_timeout: " << spec.request_timeout
      << ", retry_interval: " << spec.retry_interval << ", fault: {drop: " << spec.fault_drop
      << ", delay_ms: " << spec.fault_delay_ms << "}}\n"
      << "checkpoint: {every_s: " << spec.checkpoint_every_s << ", keep: " << spec.checkpoint_keep
      << (spec.checkpoint.empty() ? "" : ", " + spec.checkpoint) << "}\n";
    if (spec.curve) {
      y << "security: {curve: true, keys: " << (dir_.path() / "keys").string() << "}\n";
      write_cluster_keys(dir_.path() / "keys", spec.ps, spec.workers);
    }
    cluster_file_ = dir_.path() / "cluster.yaml";
    std::ofstream(cluster_file_) << y.str();
    config_ = load_config(cluster_file_);
  }

  const ClusterConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_.path(); }
  const std::filesystem::path& cluster_file() const { return cluster_file_; }

  // Starts ps `index` (again, after the previous process of that index ended).
  ChildProcess& start_ps(std::uint32_t index, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{
        pstrain_binary(),      "--role", "ps", "--index", std::to_string(index), "--cluster",
        cluster_file_.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (ps_.size() <= index) ps_.resize(index + 1);
    ps_[index].reset();
    ps_[index] = std::make_unique<ChildProcess>(argv, log_path(index));
    return *ps_[index];
  }
  void start_all() {
    for (std::uint32_t i = 0; i < config_.ps.size(); ++i) start_ps(i);
  }
  ChildProcess& ps(std::uint32_t index) { return *ps_.at(index); }
  std::filesystem::path log_path(std::uint32_t index) const {
    return dir_.path() / ("ps" + std::to_string(index) + ".out");
  }

 private:
  TempDir dir_;
  std::filesystem::path cluster_file_;
  ClusterConfig config_;
  std::vector<std::unique_ptr<ChildProcess>> ps_;
};

// A forked copy of the test process running `body`; its exit code is 0 when
// body returns, 1 when it throws (the message goes to stderr).
class ForkedClient {
 public:
  explicit ForkedClient(const std::function<void()>& body) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int code = 0;
      try {
        body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "client %d: %s\n", static_cast<int>(::getpid()), e.what());
        code = 1;
      }
      ::_exit(code);
    }
  }
  ForkedClient(const ForkedClient&) = delete;
  ForkedClient& operator=(const ForkedClient&) = delete;
  ~ForkedClient() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  // Exit code (128+signal if killed), or nullopt if still running at the deadline.
  std::optional<int> wait_for(std::chrono::duration<double> timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_)
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      else if (std::chrono::steady_clock::now() >= deadline)
        return std::nullopt;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace pstrain::testing
