#pragma once
// The parts of a worker's training loop that the asynchronous and the
// synchronous trainers share: the step budget, loading batches into the
// model's input (through pinned staging buffers on backends the host cannot
// reach), recorded steps (CUDA graphs), and the periodic heartbeat that
// reports progress to ps 0, writes a metrics line and calls the progress
// hook.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/compute/backend.h"
#include "client/data/dataset.h"
#include "shared/config.h"
#include "shared/metrics.h"
#include "shared/metrics_registry.h"

namespace pstrain {

class Model;
class PsClient;

struct TrainSummary {
  std::uint64_t local_samples = 0;
  std::uint64_t global_samples = 0;  // as last reported by ps 0
  std::uint64_t steps = 0;
  double seconds = 0;
};

// Called after every heartbeat with the global sample count and the worker's
// recent loss; worker 0 uses it to trigger evaluations and show progress.
using ProgressHook = std::function<void(std::uint64_t global_samples, double epoch, double loss,
                                        double samples_per_s)>;

// What a training loop works with: one worker's model on its backend, its
// part of the data, its ps client, metrics file and metrics registry, and
// the progress hook.
struct TrainContext {
  const ClusterConfig& config;
  std::uint32_t index;
  Backend& backend;
  Model& model;
  PsClient& ps;
  WorkerShard& shard;
  MetricsFile& metrics;
  MetricsRegistry& registry;
  ProgressHook hook;
};

// Host views of every variable of a model, for the ps client to pull into
// and push from: the backend's own memory when the host can reach it, else
// pinned staging buffers that the trainer moves with upload and download.
class HostViews {
 public:
  // `grads`: also views of the gradients (the async trainer pushes them).
  HostViews(Backend& backend, Model& model, bool grads);
  bool direct() const { return direct_; }
  std::span<float> weights(std::size_t variable) const { return weights_[variable]; }
  std::span<float> grads(std::size_t variable) const { return grads_.at(variable); }

 private:
  bool direct_;
  std::vector<HostMemory> staging_;
  std::vector<std::span<float>> weights_, grads_;
};

// Keeps a ps client's requests from outliving the buffers they send from
// and receive into (zero-copy: PsClient). When the scope is left by an
// exception (a backend wait that failed, a peer's error) while pushes or
// pulls are in flight, the destructor abandons them (PsClient::abandon_all:
// no waiting for replies that may never come, one deadline for ZeroMQ to
// let go of the frames): ZeroMQ then no longer reads the staging buffers
// and no reply is written into them once they are freed. Declare it after
// the buffers, so it runs before they go.
class PsRequestsGuard {
 public:
  explicit PsRequestsGuard(PsClient& ps);
  ~PsRequestsGuard();
  PsRequestsGuard(const PsRequestsGuard&) = delete;
  PsRequestsGuard& operator=(const PsRequestsGuard&) = delete;

 private:
  PsClient& ps_;
  int exceptions_;  // std::uncaught_exceptions() at construction
};

// Batches of train.batch_size in `config.train.epochs` passes over the shard,
// rounded up. Every worker of a run gets the same number (shards are equal).
std::uint64_t total_steps(const ClusterConfig& config, const WorkerShard& shard);
// Optimizer steps of a run: total_steps' batches in groups of
// train.accumulate_steps micro-batches, the last group possibly shorter.
std::uint64_t optimizer_steps(const ClusterConfig& config, const WorkerShard& shard);
// The micro-batches of optimizer step `step` (0-based).
std::uint32_t micro_batches(const ClusterConfig& config, const WorkerShard& shard,
                            std::uint64_t step);
// The whole steps behind `samples` of a worker's samples: epochs end in a
// shorter batch (WorkerShard::next_batch), and a partly counted batch is
// done again. Where a restarted worker resumes (WorkerShard::seek).
std::uint64_t steps_for_samples(const WorkerShard& shard, std::uint64_t samples,
                                std::size_t batch_size);

// Sets the backend's GEMMs to `wanted` (train.precision) and returns it, or,
// where the backend cannot compute at it, logs "train.precision=P is not
// available on BACKEND: WHY; training in fp32" and returns fp32: a run
// configured for a GPU still trains on a CPU, and says how.
Precision apply_precision(Backend& backend, Precision wanted);

// Whether a worker of `config` on `backend` scales its loss: fp16 where the
// backend computes it (apply_precision falls back to fp32 elsewhere).
bool scales_loss(const ClusterConfig& config, const Backend& backend);

// Whether a worker of `config` records its steps on `backend`
// (train.cuda_graphs; Backend::make_step_graph): where the backend records
// (CUDA), at fp32 and with one micro-batch per step. A replay repeats
// recorded calls, so none of a step's host decisions may change between
// steps: not fp16's loss scale and overflow checks, not accumulation's
// sums (a step's first micro-batch starts them, the later ones add), not
// the reduced-precision GEMMs' scratch memory, which grows as needed.
bool records_steps(const ClusterConfig& config, const Backend& backend);

// "conv2d cudnn 480, dense cublaslt 960, step_graph replayed 239": which
// implementations a backend's ops took (Backend::path_counts), for the log.
std::string describe_paths(const PathCounts& paths);

// A trainer's step work (forward and backward, or the optimizer step) for
// batches of `batch_size`, from a step graph. The first full batch runs
// eagerly, so that lazy set-up (cuBLASLt's and cuDNN's plans, the loading of
// kernels) happens outside a capture; the second records the graph and the
// later ones replay it. A smaller batch (an epoch's last) runs eagerly: it
// comes once an epoch, where a graph of its own would cost a capture for one
// replay. When recording fails (a driver that refuses the capture), the
// worker's log says why once and every step runs eagerly from then on.
class StepGraphs {
 public:
  using Work = std::function<void(int n, const StepScalars& scalars)>;
  enum class Ran { eager, recorded, replayed };

  // `what` names the work in the log ("forward and backward").
  StepGraphs(Backend& backend, int batch_size, std::string what, Work work);
  StepGraphs(const StepGraphs&) = delete;  // its graph calls back into it
  StepGraphs& operator=(const StepGraphs&) = delete;
  Ran run(int n, const StepScalars& scalars);

 private:
  Backend& backend_;
  int batch_size_;
  std::string what_;
  Work work_;
  bool warmed_up_ = false;
  bool failed_ = false;
  std::unique_ptr<StepGraph> graph_;
};

// Gradient accumulation (train.accumulate_steps): a step's gradient is the
// mean of its micro-batches' gradients weighted by their sizes, which is the
// gradient of one batch of their union (the loss is a mean over the batch).
// The running sum lives in backend memory beside the model's gradients, one
// buffer per variable, allocated only when steps > 1. A loss scale
// (Model::set_loss_scale) is divided out of the step's gradient.
//
// Where steps are recorded (`record_batch` > 0, as records_steps allows:
// one micro-batch per step), finish() replays a batch of record_batch's
// forward and backward from a step graph (StepGraphs) and then issues every
// gradient, last layer first: they are known only once the whole graph is.
class GradAccumulator {
 public:
  GradAccumulator(Backend& backend, Model& model, std::uint32_t steps, int record_batch = 0);

  // Forward and backward on the first n samples of the model's input, a
  // micro-batch before the step's last: its gradients join the sum.
  void add(int n);
  // The step's last micro-batch: forward and backward, and on_grad_issued(i)
  // (as Model::forward_backward calls it) once model.grad(i) holds the
  // step's gradient. Starts the next step's sum afresh.
  // The loss scale must not change between a step's add()s and finish().
  void finish(int n, const std::function<void(std::size_t variable)>& on_grad_issued);

 private:
  Backend& backend_;
  Model& model_;
  std::vector<DeviceMemory> sums_;
  double samples_ = 0;  // in sums_
  std::optional<StepGraphs> graphs_;
};

// Puts batches into the model's input and reads back their losses. On
// backends the host cannot reach, batches are assembled in two pinned buffers
// in turn: the next one is gathered (stage_next) while the device computes on
// the current one, and load() only issues its upload.
class BatchFeeder {
 public:
  BatchFeeder(Backend& backend, Model& model, WorkerShard& shard, std::size_t batch_size);

  // Puts the next batch into the model's input buffers (uploads the staged
  // batch on backends the host cannot reach).
  Batch load();
  // Gathers the batch after the one load() returned into the other pinned
  // buffer; call it once the step's compute has been issued. A no-op where
  // the host writes the model's input directly.
  void stage_next();
  // Issues the download of the last batch's per-sample losses; on such
  // backends they are readable after the next fence has completed.
  void fetch_losses();
  // Mean loss of the last batch, once fetch_losses' data has arrived.
  double mean_loss() const;

 private:
  Backend& backend_;
  Model& model_;
  WorkerShard& shard_;
  std::size_t batch_size_;
  bool direct_;
  struct Staged {
    HostMemory images, labels;
    Batch batch;
    bool ready = false;
  };
  Staged staged_[2];
  int next_ = 0;  // the staging buffer load() takes next
  HostMemory host_loss_;
  const float* losses_;
  std::size_t last_ = 0;
};

// Records steps into the worker's metrics registry and, every net.heartbeat
// seconds (worker 0: every 0.25 s at most, as it also paces evaluations) and
// after the last step, sends the samples since the last report ps 0 answered
// to ps 0 (a failed report is logged and its samples go with the next),
// writes a metrics line rendered from the registry and calls the hook. The
// line (README.md, "Metrics") holds role, index, step, epoch, local_samples,
// global_samples, loss, samples_per_s, global_samples_per_s, compute_ms,
// then the trainer's figures in the order they were added (the backend's
// path counts go to the registry only); means and maxima
// are over the window since the line before. The worker's liveness does not
// depend on these reports: client/ps/heartbeat.h.
class ProgressReporter {
 public:
  // Registers the worker's series (pstrain_worker_*) in context.registry.
  explicit ProgressReporter(const TrainContext& context);

  // A finished step; `loss` is the batch's mean loss.
  void step(std::size_t samples, double loss, double compute_s);
  // A trainer figure: histogram `name` in the registry, written into the
  // line as `field`, the mean of its observations over the window times
  // `scale`.
  Histogram& mean(std::string field, std::string name, std::string help, std::vector<double> bounds,
                  double scale = 1);
  // A step's duration: histogram `name` of seconds (the registry's base
  // unit), written as `field` in milliseconds (the line's).
  Histogram& mean_ms(std::string field, std::string name, std::string help);
  // A trainer figure written as its maximum over the window: gauge `name`,
  // which the trainer raise()s and each line resets to 0.
  Gauge& max(std::string field, std::string name, std::string help);
  // A count since the worker started: counter `name`, written as `field`
  // with its value (not a window's).
  Counter& total(std::string field, std::string name, std::string help);
  // Ends the step: sleeps when this worker is a configured straggler (as
  // long as client/train/straggler.h says for its step count), and reports if a
  // heartbeat is due or `last`.
  void end_step(bool last);

  // The totals so far, with the seconds since construction.
  TrainSummary finish();

 private:
  using Clock = std::chrono::steady_clock;
  // A field of the line and how to take its value for the window ending now.
  struct Figure {
    std::string field;
    std::function<double()> take;
  };
  void report();

  const TrainContext& context_;
  double heartbeat_s_;
  bool straggler_;
  std::vector<Figure> figures_;  // declared before compute_, which mean_ms() adds to it
  Counter& steps_;
  Counter& samples_;
  Gauge& global_samples_;  // as ps 0 last counted them
  Gauge& samples_per_s_;   // the line's samples_per_s
  Gauge& recent_loss_;     // the line's loss
  Histogram& loss_;
  Histogram& compute_;
  // pstrain_worker_backend_ops_total{op, path}: Backend::path_counts, as of
  // the last report.
  MetricFamily<Counter>& backend_ops_;
  WindowedMean loss_mean_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_heartbeat_ = start_;
  // (time, global samples) of the heartbeats of the last few seconds: the
  // other workers report at their own pace, so the global rate is taken over
  // a window several of their heartbeats long rather than since our last.
  std::deque<std::pair<Clock::time_point, std::uint64_t>> global_history_;
  // The window since the last report, which is also the last heartbeat.
  Clock::time_point window_start_ = start_;
  double window_samples_ = 0;  // samples_ at its start
  double reported_ = 0;        // samples_ as of the last report ps 0 answered
  bool report_failing_ = false;
};

}  // namespace pstrain
