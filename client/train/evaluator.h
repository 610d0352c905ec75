#pragma once
// Test-set evaluation from the ps weights, in a background thread of worker 0
// so training never waits for it. The evaluator owns everything it touches:
// its own ps client (sockets), a CPU backend, a model replica and the test
// set, so the training thread shares nothing with it but the request queue.
//
// A ps that does not answer a pull (PsError) costs an evaluation, not the
// run: a periodic evaluation is skipped with a logged warning (the next one
// sees newer weights anyway); the final one, whose accuracy the run reports,
// tries again for up to net.worker_timeout before it fails.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "client/data/dataset.h"
#include "shared/config.h"
#include "shared/metrics.h"

namespace pstrain {

class Backend;
class Model;
class PsClient;
class EmbeddingExchange;

struct EvalPoint {
  std::uint64_t global_samples = 0;
  double accuracy = 0;
  double loss = 0;
  double duration_s = 0;
  std::optional<double> auc;  // bce models (then `loss` is the logloss)
};

// The metrics line of an evaluation: event "eval" for the periodic ones,
// "final" for the last (the README's metrics schema).
JsonObject eval_record(const char* event, const EvalPoint& point);

class Evaluator {
 public:
  // `sender` identifies the evaluator's requests to the ps (not a worker).
  Evaluator(const ClusterConfig& config, std::uint32_t sender, Dataset test, MetricsFile& metrics);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Starts an evaluation of the current ps weights unless one is running
  // (then this request is dropped: the next one will see newer weights).
  void request(std::uint64_t global_samples);
  // Requests an evaluation each time the global sample count passes another
  // multiple of train.eval_every (0: never).
  void on_global_samples(std::uint64_t global_samples);
  // Evaluates now and waits for the result (after any running evaluation).
  EvalPoint evaluate_now(std::uint64_t global_samples);
  // The last completed evaluation; rethrows an evaluation's failure.
  std::optional<EvalPoint> latest() const;
  // The replica holding the weights of the last evaluation (for saving the
  // model after evaluate_now()).
  Model& model();
  const Dataset& test_set() const { return test_; }

 private:
  struct Job {
    std::uint64_t global_samples = 0;
    bool final = false;  // evaluate_now's: retried rather than skipped
  };
  void loop();
  EvalPoint evaluate(const Job& job);
  // Pulls every variable into the replica; on a PsError tries again until
  // `deadline` (none after it), then rethrows.
  void pull_weights(std::chrono::steady_clock::time_point deadline);

  const ClusterConfig& config_;
  Dataset test_;
  MetricsFile& metrics_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PsClient> ps_;
  std::unique_ptr<EmbeddingExchange> rows_;  // with embedding layers; on the evaluator's thread

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  std::uint64_t next_eval_;     // the next multiple of eval_every
  std::optional<Job> pending_;  // the queued request
  bool busy_ = false;
  bool stop_ = false;
  std::uint64_t completed_ = 0;
  std::optional<EvalPoint> latest_;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace pstrain
