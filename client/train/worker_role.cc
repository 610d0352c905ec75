#include "client/train/worker_role.h"

#include <cstdio>

#include "client/compute/cpu/cpu_backend.h"
#include "client/compute/cuda_loader.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/model/model_io.h"
#include "client/ps/heartbeat.h"
#include "client/ps/ps_client.h"
#include "client/ps/ps_restarts.h"
#include "client/train/backend_setup.h"
#include "client/train/evaluator.h"
#include "client/train/progress_line.h"
#include "client/train/step_budget.h"
#include "client/train/trainer.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/metrics_server.h"
#include "shared/modes.h"

namespace pstrain {
namespace {

// Evaluators talk to the ps under ids no worker has, so the ps does not count
// them as workers (liveness, done).
constexpr std::uint32_t kEvaluatorSender = 1u << 16;

std::unique_ptr<Backend> make_backend(const ClusterConfig& config, std::uint32_t index) {
  const WorkerSpec& spec = config.workers.at(index);
  const int threads = static_cast<int>(config.train.threads);
  if (spec.device == Device::cpu) return make_cpu_backend(threads);
  // Memory only: the model computes nothing (Model::emulate).
  if (spec.device == Device::emulated) return make_cpu_backend(1);
  const int gpu = spec.gpu < 0 ? 0 : spec.gpu;
  if (spec.device == Device::cuda) return cuda::make_cuda_backend(gpu);
  try {
    return cuda::make_cuda_backend(gpu);
  } catch (const cuda::CudaUnavailable& e) {
    log("device auto: no usable GPU (", e.what(), "); training on the CPU");
    return make_cpu_backend(threads);
  }
}

// `test`: the evaluated split, which may know the best AUC a model can
// reach on it (synthetic-ctr's teacher).
void print_final(const EvalPoint& point, double seconds, const Dataset& test) {
  std::printf("final test accuracy %.4f (loss %.4f) after %llu global samples, %.1f s\n",
              point.accuracy, point.loss, static_cast<unsigned long long>(point.global_samples),
              seconds);
  if (point.auc) {
    std::printf("final test AUC %.4f, logloss %.4f", *point.auc, point.loss);
    if (test.ceiling_auc >= 0)
      std::printf(" (the data's teacher: AUC %.4f, logloss %.4f)", test.ceiling_auc,
                  test.ceiling_logloss);
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Worker 0's gauges of its latest evaluation; the AUC and logloss ones only
// for a click model.
class EvalGauges {
 public:
  EvalGauges(MetricsRegistry& registry, bool binary)
      : accuracy_(registry
                      .gauge("pstrain_worker_test_accuracy",
                             "Test accuracy of worker 0's latest evaluation.")
                      .with()),
        loss_(
            registry.gauge("pstrain_worker_test_loss", "Test loss of worker 0's latest evaluation.")
                .with()) {
    if (!binary) return;
    auc_ = &registry
                .gauge("pstrain_worker_test_auc",
                       "Test AUC of worker 0's latest evaluation (click models).")
                .with();
    logloss_ = &registry
                    .gauge("pstrain_worker_test_logloss",
                           "Test logloss of worker 0's latest evaluation (click models).")
                    .with();
  }
  void set(const EvalPoint& point) {
    accuracy_.set(point.accuracy);
    loss_.set(point.loss);
    if (auc_ && point.auc) {
      auc_->set(*point.auc);
      logloss_->set(point.loss);
    }
  }

 private:
  Gauge& accuracy_;
  Gauge& loss_;
  Gauge* auc_ = nullptr;
  Gauge* logloss_ = nullptr;
};

}  // namespace

int run_worker_role(const ClusterConfig& config, std::uint32_t index) {
  if (config.workers_auto)
    throw ConfigError(
        "workers: auto is resolved by tools/launch; give an explicit list "
        "or {count: N} to start workers by hand");
  const auto n_workers = static_cast<std::uint32_t>(config.workers.size());
  // First: a metrics port already taken stops the worker before it joins.
  ProcessMetrics process_metrics(config, Role::worker, index);
  MetricsRegistry& registry = process_metrics.registry();
  // A restarted worker is a new process: its start time says so.
  registry.gauge("pstrain_worker_start_time_seconds", "UNIX time this worker process started.")
      .with()
      .set(unix_time());
  // From the start, so that loading the data and a slow GPU start count as
  // alive as much as a long step or the final evaluation do.
  auto heartbeats = std::make_unique<HeartbeatThread>(config, index);

  auto backend = make_backend(config, index);
  const Precision precision = apply_precision(*backend, config.train.precision);
  registry
      .gauge("pstrain_worker_precision_fallback",
             "1 when the backend cannot compute at train.precision and trains in fp32.")
      .with()
      .set(precision != config.train.precision ? 1 : 0);
  // criteo's training split is read as this worker's part only.
  const Dataset train = load_dataset(config.data, true, index, n_workers);
  WorkerShard shard(train, index, n_workers, config.train.seed);
  Model model(config.model, *backend, InputShape{train.channels, train.height, train.width},
              train.classes, static_cast<int>(config.train.batch_size), config.tables);
  check_ids_for_embeddings(model.embeddings(), train);
  const bool emulated = config.workers.at(index).device == Device::emulated;
  if (emulated) {
    model.emulate(config.train.emulated_step_ms);
    log("device emulated: no compute; each step takes ", config.train.emulated_step_ms,
        " ms and pushes gradients of ", Model::kEmulatedDecay,
        " x the weights (docs/scaling.md): samples/s measure the network and the ps, accuracy "
        "means nothing");
  }
  if (!model.embeddings().empty() && precision == Precision::fp16)
    throw ConfigError(
        "train.precision fp16 with embedding layers: the loss scaler does not yet check the row "
        "gradients for overflow; use bf16 or fp32");
  log("backend ", backend->name(), ", model ", config.model.preset, " (", model.parameter_count(),
      " parameters), ", shard.size(), " training samples of ", train.size(), ", batch ",
      config.train.batch_size, " x ", config.train.accumulate_steps, " accumulated, precision ",
      to_string(precision));

  PsClient ps(config, index, shard_map_for(config, model.variables()));
  const auto state_updates = ps.hello();
  // ps 0 has counted samples once the run is under way: then no ps may
  // serve fresh values (one restarted without its checkpoint).
  refuse_fresh_servers(ps, state_updates, ps.report_progress(0) > 0);
  ps.init(config.train.seed);
  // A restarted async worker goes on where ps 0 counted it (a restored ps 0:
  // as of its checkpoint); sync workers join the step their peers recorded.
  std::uint64_t first_step = 0;
  if (!traits(config.mode).allreduce()) {
    if (const auto done = ps.samples_counted(); done > 0) {
      // A partly done accumulation group is done again from its start.
      first_step =
          steps_for_samples(shard, done, config.train.batch_size) / config.train.accumulate_steps;
      log("resuming after ", done, " samples ps 0 counted of this worker: step ", first_step);
    }
  }

  MetricsFile metrics(config.run_dir / ("worker" + std::to_string(index) + ".metrics.jsonl"));
  std::unique_ptr<Evaluator> evaluator;
  std::unique_ptr<ProgressLine> progress;
  std::optional<EvalGauges> gauges;
  if (index == 0) {
    gauges.emplace(registry, model.binary());
    // Under security.curve a request's sender is its key's, and this process
    // holds worker 0's key only: the evaluator speaks as worker 0 (its pulls
    // count as worker 0 being heard, which it is).
    const auto evaluator_sender = config.security.curve ? index : kEvaluatorSender;
    evaluator = std::make_unique<Evaluator>(config, evaluator_sender,
                                            load_dataset(config.data, false), metrics);
    progress = std::make_unique<ProgressLine>();
  }

  ReportHook hook;
  if (evaluator) {
    const double total = config.train.epochs * static_cast<double>(shard.size()) * n_workers;
    // `total` by value: it ends with this block, the hook lives on.
    hook = [&, total](std::uint64_t global, double epoch, double loss, double rate) {
      if (!emulated) evaluator->on_global_samples(global);
      ProgressFigures state;
      state.epoch = epoch;
      state.epochs = config.train.epochs;
      state.global_samples = global;
      state.samples_per_s = rate;
      state.loss = loss;
      if (auto last = evaluator->latest()) {
        state.test_accuracy = last->accuracy;
        state.test_auc = last->auc;
        gauges->set(*last);
      }
      state.eta_s = rate > 0 ? std::max(0.0, total - static_cast<double>(global)) / rate : -1;
      progress->update(state);
    };
  }

  const TrainContext context{config, index, *backend, model, ps, shard, metrics, registry, hook};
  const TrainSummary summary = pstrain::train(context, first_step);

  log("trained ", summary.local_samples, " samples in ", summary.steps, " steps, ", summary.seconds,
      " s; waiting for the other workers");
  log("backend paths: ", describe_paths(backend->path_counts()));
  // Every worker's last push (sync: worker 0's last assign) lands before
  // anyone evaluates or saves. Worker 0 goes on evaluating while slower
  // workers still train, so the accuracy curve has no gap at the end.
  ps.barrier("train-done", n_workers, [&](std::uint64_t global) {
    if (evaluator && !emulated) evaluator->on_global_samples(global);
  });

  if (evaluator && emulated) {
    progress.reset();
    const std::uint64_t global = ps.heartbeat();
    std::printf(
        "final: device emulated (%g ms a step), no test accuracy; %llu global samples, "
        "%.3f s\n",
        config.train.emulated_step_ms, static_cast<unsigned long long>(global), summary.seconds);
    std::fflush(stdout);
    metrics.write(JsonObject()
                      .add("event", "done")
                      .add("emulated_step_ms", config.train.emulated_step_ms)
                      .add("global_samples", global)
                      .add("train_s", summary.seconds));
  } else if (evaluator) {
    // After the barrier ps 0 has counted every worker's samples.
    const EvalPoint final_point = evaluator->evaluate_now(ps.heartbeat());
    gauges->set(final_point);
    progress.reset();
    print_final(final_point, summary.seconds, evaluator->test_set());
    const auto model_path = config.run_dir / "model.bin";
    save_model(model_path, evaluator->model(), config, final_point.global_samples);
    JsonObject final_record = eval_record("final", final_point).add("train_s", summary.seconds);
    if (const Dataset& test = evaluator->test_set(); test.ceiling_auc >= 0)
      final_record.add("teacher_auc", test.ceiling_auc)
          .add("teacher_logloss", test.ceiling_logloss);
    metrics.write(final_record);
    log("saved the model to ", model_path.string());
    // The servers' full state (values, optimizer state, versions), so a
    // later run can continue with `pstrain --role ps --restore
    // <run_dir>/snapshot`.
    for (std::uint32_t s = 0; s < config.ps.size(); ++s) ps.snapshot(s);
    log("snapshot of every ps in ", (config.run_dir / "snapshot").string());
  }
  // Stopped first: once every worker is done the servers exit, and a
  // heartbeat to them would wait out its timeout.
  heartbeats.reset();
  ps.done(summary.local_samples);
  process_metrics.finish();
  return 0;
}

void check_model(const ClusterConfig& config) {
  const DataShape shape = data_shape(config.data);
  Dataset probe;
  probe.name = config.data.name;
  probe.ids_per_sample = shape.ids_per_sample;
  check_ids_for_embeddings(
      Model::check(config.model, InputShape{shape.channels, shape.height, shape.width},
                   shape.classes, config.tables),
      probe);
}

int run_eval_role(const ClusterConfig& config, const std::filesystem::path& model_path) {
  const Dataset test = load_dataset(config.data, false);
  auto backend = make_cpu_backend(static_cast<int>(config.train.threads));
  Model model(config.model, *backend, InputShape{test.channels, test.height, test.width},
              test.classes, 500, config.tables);
  if (!model.embeddings().empty())
    throw ConfigError(
        "--role eval: a saved model holds no embedding tables (they live on the ps); worker 0 "
        "evaluates such a model during the run");
  load_model_weights(model_path, model);
  const EvalResult result = model.evaluate(test);
  std::printf("%s: test accuracy %.4f, loss %.4f on %zu samples (%s)\n",
              model_path.string().c_str(), result.accuracy, result.loss, result.samples,
              test.name.c_str());
  return 0;
}

}  // namespace pstrain
