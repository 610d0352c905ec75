#include "client/train/evaluator.h"

#include <cmath>

#include <algorithm>
#include <chrono>
#include <thread>

#include "client/compute/cpu/cpu_backend.h"
#include "client/model/model.h"
#include "client/ps/ps_client.h"
#include "client/train/embedding_exchange.h"
#include "shared/log.h"

namespace pstrain {
namespace {

// Large enough to amortize per-batch overhead, small enough that the
// activations of the CNN stay a few tens of MiB.
constexpr int kEvalBatch = 500;

}  // namespace

JsonObject eval_record(const char* event, const EvalPoint& point) {
  JsonObject record = JsonObject()
                          .add("role", "worker")
                          .add("index", 0)
                          .add("event", event)
                          .add("global_samples", point.global_samples)
                          .add("test_accuracy", point.accuracy)
                          .add("test_loss", point.loss);
  // A test split of one class has no AUC (NaN, which JSON cannot hold).
  if (point.auc && std::isfinite(*point.auc))
    record.add("test_auc", *point.auc).add("test_logloss", point.loss);
  return record;
}

Evaluator::Evaluator(const ClusterConfig& config, std::uint32_t sender, Dataset test,
                     MetricsFile& metrics)
    : config_(config),
      test_(std::move(test)),
      metrics_(metrics),
      next_eval_(config.train.eval_every) {
  // OpenBLAS's thread count is process-wide: the evaluator's backend keeps
  // the one training set rather than resetting it.
  backend_ = make_cpu_backend(static_cast<int>(config.train.threads));
  model_ = std::make_unique<Model>(config.model, *backend_,
                                   InputShape{test_.channels, test_.height, test_.width},
                                   test_.classes, kEvalBatch, config.tables);
  // The ps's f32 values, whatever net.wire_dtype: the evaluation (and the
  // saved model) is of the model as trained, not of its rounded copy.
  auto options = client_options(config, sender);
  options.wire_dtype = WireDType::fp32;
  ps_ = std::make_unique<PsClient>(ps_addresses(config), shard_map_for(config, model_->variables()),
                                   config.run_id(), std::move(options));
  ps_->hello();
  if (!model_->embeddings().empty())
    rows_ = std::make_unique<EmbeddingExchange>(*model_, *ps_, config.tables);
  thread_ = std::thread([this] { loop(); });
}

Evaluator::~Evaluator() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Evaluator::request(std::uint64_t global_samples) {
  {
    std::lock_guard lock(mutex_);
    if (busy_ || pending_) return;
    pending_ = Job{global_samples, false};
  }
  wake_.notify_all();
}

void Evaluator::on_global_samples(std::uint64_t global_samples) {
  const auto every = config_.train.eval_every;
  if (every == 0 || global_samples < next_eval_) return;
  request(global_samples);
  next_eval_ = (global_samples / every + 1) * every;
}

EvalPoint Evaluator::evaluate_now(std::uint64_t global_samples) {
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [&] { return !busy_ && !pending_; });
  if (error_) std::rethrow_exception(error_);
  pending_ = Job{global_samples, true};
  const auto target = completed_ + 1;
  wake_.notify_all();
  finished_.wait(lock, [&] { return completed_ >= target || error_; });
  if (error_) std::rethrow_exception(error_);
  return *latest_;
}

std::optional<EvalPoint> Evaluator::latest() const {
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  return latest_;
}

Model& Evaluator::model() { return *model_; }

void Evaluator::loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || pending_; });
    if (stop_) return;
    const Job job = *pending_;
    pending_.reset();
    busy_ = true;
    lock.unlock();
    std::optional<EvalPoint> point;
    std::exception_ptr error;
    try {
      point = evaluate(job);
    } catch (const PsError& e) {
      if (job.final) {
        error = std::current_exception();
      } else {
        log("warning: evaluation at ", job.global_samples, " global samples skipped: ", e.what());
      }
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (point) latest_ = point;
    if (error) error_ = error;
    ++completed_;
    finished_.notify_all();
  }
}

void Evaluator::pull_weights(std::chrono::steady_clock::time_point deadline) {
  const auto& vars = model_->variables();
  while (true) {
    try {
      for (std::size_t i = 0; i < vars.size(); ++i)
        ps_->pull(vars[i].name, {model_->param(i).data(), vars[i].size});
      ps_->wait_all();
      return;
    } catch (const PsError& e) {
      // The other pulls of this try are still in flight: they end (answered,
      // failed or timed out) before the next try writes the same buffers.
      for (bool drained = false; !drained;) {
        try {
          ps_->wait_all();
          drained = true;
        } catch (const PsError&) {
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) throw;
      log("warning: the final evaluation's pull failed (", e.what(), "); trying again");
      // An error reply comes at once: do not hammer the ps with tries.
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(1), deadline - now));
    }
  }
}

EvalPoint Evaluator::evaluate(const Job& job) {
  const auto start = std::chrono::steady_clock::now();
  EvalPoint point;
  point.global_samples = job.global_samples;
  pull_weights(job.final ? start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(config_.net.worker_timeout))
                         : start);
  // Embedding layers get each test batch's rows from the ps.
  const auto prepare = [this](std::size_t first, std::size_t n) {
    rows_->pull_samples(static_cast<int>(n),
                        std::span(test_.sample_ids(first), n * test_.ids_per_sample));
  };
  const EvalResult result =
      rows_ ? model_->evaluate(test_, SIZE_MAX, prepare) : model_->evaluate(test_);
  point.accuracy = result.accuracy;
  point.loss = result.loss;
  point.auc = result.auc;
  point.duration_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_.write(eval_record("eval", point).add("eval_s", point.duration_s));
  return point;
}

}  // namespace pstrain
