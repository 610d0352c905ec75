#pragma once
// The cluster configuration: cluster.yaml plus --set overrides, validated.
//
// One schema for every role (documented in docs/config.md). Every
// wrong, missing or unknown key raises ConfigError naming the key's dotted
// path and what was expected. `auto` values (workers: auto, device: auto) are
// left for the launcher to resolve; a process given an unresolved `auto` that
// it needs reports so.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "shared/embedding.h"
#include "shared/error.h"
#include "shared/fault.h"
#include "shared/gradient_compression.h"
#include "shared/optimizer.h"
#include "shared/shard_map.h"

namespace pstrain {

struct ConfigError : pstrain::Error {
  using pstrain::Error::Error;
};

struct PsEndpoint {
  std::string host = "127.0.0.1";  // the address others dial
  std::uint16_t port = 0;
  std::string bind;  // the address to listen on; empty: host

  std::string connect_address() const;  // "tcp://host:port"
  std::string bind_address() const;     // "tcp://bind-or-host:port"
};

// emulated: no compute, a stated time per step instead (Model::emulate,
// train.emulated_step_ms), for scaling runs with more workers than cores.
enum class Device { cpu, cuda, auto_, emulated };

struct WorkerSpec {
  // Left out: 127.0.0.1, or the scheduler's host when ClusterConfig::hosts_pending.
  std::string host;
  Device device = Device::cpu;
  int gpu = -1;  // -1: auto (the launcher assigns one per worker on a host)
};

// How workers combine their work (docs/modes.md):
// - async: each gradient is applied by the ps as it arrives;
// - sync: gradients all-reduced between workers every step, each worker
//   applying the same averaged update;
// - ssp: async through the ps, but no worker more than train.staleness_bound
//   steps ahead of the slowest (the ps holds its pulls);
// - backup: each step the ps applies the mean of the first N - b gradients
//   (train.backup_workers b) and drops the late ones;
// - local (local SGD): each worker steps on its own for train.local_steps
//   steps, then the workers average their weights through the all-reduce.
// What each implies for the ps, the worker and a lost worker:
// shared/modes.h.
enum class Mode { async, sync, ssp, backup, local_sgd };

// What a ps does when a worker that has not finished goes silent for
// net.worker_timeout: go on with the live ones, or exit 3 naming it.
enum class WorkerLoss { continue_, fail };

// The arithmetic of a worker's GEMMs (dense layers and the convolutions'
// products): operands rounded to this format (shared/low_precision.h), float32
// accumulation and outputs, float32 master weights on the worker and the ps.
// fp16 also scales the loss (client/train/loss_scaler.h). A backend that cannot
// compute at the chosen precision says why (Backend::precision_unavailable),
// and the worker trains in fp32, saying so.
enum class Precision { fp32, bf16, fp16 };

// The element type of weights and gradients on the wire (net.wire_dtype).
// The ps keeps float32 values and optimizer state whatever travels; a 16-bit
// type halves the bytes each way at the cost of rounding what is sent
// (shared/low_precision.h).
enum class WireDType { fp32, bf16, fp16 };

struct ModelLayer {  // one entry of a model given as a list of layers
  // dense, relu, conv2d, maxpool2d, flatten, embedding, embedding_bag, concat,
  // dot_interaction
  std::string type;
  int units = 0;             // dense
  int filters = 0;           // conv2d
  int kernel = 0;            // conv2d, maxpool2d
  std::string table = {};    // embedding, embedding_bag: the table its ids name
  int ids = 0;               // embedding, embedding_bag: ids per sample
  std::string pool = "sum";  // embedding_bag: sum | mean
  // embedding, embedding_bag: the sample's id its ids start at; -1: after
  // the previous embedding layer's.
  int first_id = -1;
  std::string name = {};                 // how `inputs` name it; "": its default name
  std::vector<std::string> inputs = {};  // the layers it reads; empty: the one before
};

// The tables the click-through presets (dlrm, wide_deep) look their ids up
// in; a run with such a preset gets them with these names unless `tables`
// has them already (docs/ctr.md).
inline constexpr std::string_view kCtrTable = "ctr_embeddings";
inline constexpr std::string_view kCtrWideTable = "ctr_wide";
// The shape the presets expect of a sample: Criteo's 13 integer features
// and 26 categorical fields.
inline constexpr int kCtrDenseFeatures = 13, kCtrFields = 26;

struct ModelConfig {
  std::string preset = "mlp";      // mlp | cnn | dlrm | wide_deep | custom
  std::vector<ModelLayer> layers;  // for custom models
  // softmax: cross-entropy over the last layer's units, one per class;
  // bce: binary cross-entropy on one logit; auto: bce for dlrm and
  // wide_deep, softmax otherwise.
  std::string loss = "auto";
  // The click-through presets' sizes: the embedding rows' width, and the
  // hidden units of each MLP (every hidden layer followed by a relu).
  int embedding_dim = 16;
  std::vector<int> bottom_mlp = {64};    // dlrm: over the dense features, then embedding_dim
  std::vector<int> top_mlp = {64};       // dlrm: over the interaction, then one logit
  std::vector<int> deep_mlp = {64, 32};  // wide_deep: over embeddings and dense features
  bool uses_bce() const {
    return loss == "bce" || (loss == "auto" && (preset == "dlrm" || preset == "wide_deep"));
  }
};

// data.synthetic_ctr: the generator of synthetic-ctr (client/data/synthetic_ctr.h).
struct SyntheticCtrConfig {
  std::uint64_t seed = 1;    // the planted teacher and every sample
  double vocab_scale = 1;    // x Criteo's per-field vocabulary sizes (each at least 1)
  double zipf_s = 1.1;       // exponent of each field's Zipf distribution of values
  double click_rate = 0.25;  // the mean click probability the teacher is calibrated to
};

struct DataConfig {
  // fashion-mnist | synthetic | synthetic-ids | criteo | synthetic-ctr
  std::string name = "fashion-mnist";
  std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  std::uint64_t synthetic_train = 6000;  // synthetic dataset sizes (synthetic-ctr too)
  std::uint64_t synthetic_test = 1000;
  // criteo: Criteo's TSV files (plain or gzip), docs/ctr.md. Empty: none.
  std::filesystem::path train;
  std::filesystem::path test;
  // criteo: > 0: the test split is this fraction of `train`'s line blocks
  // (and `test` is not read); 0: the test split is `test`.
  double test_fraction = 0;
  bool skip_bad_lines = false;       // criteo: skip (and count) malformed lines
  bool log_integers = true;          // criteo, synthetic-ctr: dense feature = log(1 + max(x, 0))
  std::uint32_t block_lines = 4096;  // criteo: lines per block (worker k reads blocks k mod N)
  SyntheticCtrConfig synthetic_ctr;
};

// train.straggler_worker: all, every worker straggles.
inline constexpr std::int32_t kEveryWorker = -2;

struct TrainConfig {
  std::uint32_t batch_size = 64;  // per worker
  double epochs = 1;              // passes of each worker over its part
  std::uint64_t seed = 42;
  std::uint64_t eval_every = 20000;  // global samples between evaluations; 0: off
  std::uint32_t threads = 1;         // BLAS threads per worker
  std::uint32_t sync_every = 50;     // sync mode: steps between writes to the ps
  bool lr_scaling = false;           // sync mode: lr x workers (Goyal et al.)
  std::uint32_t warmup_steps = 0;    // sync mode: linear warm-up to the scaled lr
  // Workers slowed down on purpose (client/train/straggler.h): an index, -1 for
  // none, or kEveryWorker.
  std::int32_t straggler_worker = -1;
  double straggler_delay_ms = 0;           // ... by this much per step
  double straggler_jitter_ms = 0;          // ... give or take up to this much
  double straggler_pause_probability = 0;  // ... and per step, this likely,
  double straggler_pause_ms = 0;           // ... an extra pause this long
  // Workers with device: emulated take this long per step (forward and
  // backward) instead of computing; required by them, refused without them.
  double emulated_step_ms = 0;
  // sync mode: all-reduce bucket size; small enough that a model of ~1 MB
  // fills several, so reducing the first overlaps the rest of backward.
  std::uint32_t bucket_bytes = 256 * 1024;
  std::uint32_t staleness_bound = 1;  // ssp: steps a worker may run ahead of the slowest
  std::uint32_t backup_workers = 1;   // backup: gradients of a step the ps does not wait for
  std::uint32_t local_steps = 8;      // local: steps between weight averages
  // Micro-batches of batch_size whose gradients a worker averages before one
  // push (async modes) or one all-reduce and optimizer step (sync, local):
  // the effective batch is accumulate_steps x batch_size. Steps count these
  // optimizer steps everywhere (sync_every, local_steps, warm-up, ssp clocks).
  std::uint32_t accumulate_steps = 1;
  // Embedding layers: pull the next batch's rows while the current one
  // computes (1), one update stale for the rows both touch; 0: never.
  std::uint32_t prefetch = 0;
  // Modes async and ssp: 1 computes step t+1 on the weights
  // step t-1's replies brought while step t's requests are still on their
  // way (client/train/ps_step.h), one step staler; 0: each step waits for
  // its own replies.
  std::uint32_t pipeline = 0;
  // With pipeline 1: the weights a step computes on are the landed ones
  // moved on by this many times their change since the step before
  // (PipeDream-2BW's and SpecTrain's weight prediction), standing in for
  // the update still in flight; 0: the landed weights as they are.
  double weight_prediction = 1.0;
  Precision precision = Precision::fp32;
  // GPU workers record each step's kernels once as a CUDA graph and replay
  // it (client/train/step_graphs.h); false: every step launches them.
  bool cuda_graphs = true;
  // With --trace (shared/trace.h): the steps a worker records, after the
  // first trace_skip (allocations, first pulls: not the steady state).
  std::uint32_t trace_steps = 50;
  std::uint32_t trace_skip = 5;
  // Follows the mode unless given (the mode's field sets it): an async run
  // can finish without a worker, a sync one cannot.
  WorkerLoss on_worker_loss = WorkerLoss::continue_;
};

struct NetConfig {
  std::uint64_t chunk_bytes = ShardMap::kDefaultChunkBytes;
  double request_timeout = 30;  // s: a ps that does not answer is an error
  double retry_interval = 1;    // s before a data request is first resent (doubling)
  double worker_timeout = 60;   // s: a ps exits when no worker was heard for this long
  double heartbeat = 1;         // s between worker heartbeats
  WireDType wire_dtype = WireDType::fp32;
  // ZeroMQ I/O threads per process; 0: io_threads() picks.
  std::uint32_t io_threads = 0;
  // Dense pushes compressed with error feedback (top-k, sign); pulls and
  // all-reduces are not (shared/gradient_compression.h).
  Compression compression;
  FaultConfig fault;  // for testing only
};

// The ZeroMQ I/O threads of a process with `peers` connections (a ps: the
// workers; a worker: the servers) on a host of `cores` hardware threads:
// `configured` when nonzero, else one per 8 cores, at least 1 and no more
// than the connections (ZeroMQ serves each connection on one I/O thread, so
// more would idle), leaving the cores to the compute and the ps's handlers.
std::uint32_t io_threads(std::uint32_t configured, std::uint32_t peers, std::uint32_t cores);

// Seconds between a worker's liveness heartbeats (client/ps/heartbeat.h):
// net.heartbeat, or a quarter of net.worker_timeout when that is shorter.
double liveness_interval(const NetConfig& net);
// How long the process holding a worker index must have been silent before
// a new process (another incarnation) may take the index over: three
// liveness intervals. A restart after a crash waits at most this long; a
// second live process with the same index is refused (server/coordinator.h).
double takeover_silence(const NetConfig& net);

struct CheckpointConfig {
  double every_s = 60;     // s between checkpoints of every ps; 0: none
  std::uint32_t keep = 3;  // generations each ps keeps
  // Checkpoints after the first write only the table rows updated (and the
  // keys removed) since the previous one; every full_every-th is whole
  // (docs/embeddings.md).
  bool incremental = false;
  std::uint32_t full_every = 10;
};

// Who may talk to a ps (docs/security.md).
struct SecurityConfig {
  bool curve = false;                   // ZeroMQ CURVE on every pstrain socket, keys per identity
  std::filesystem::path keys = "keys";  // pstrain keygen's directory (shared/curve_keys.h)
};

// Every ps and worker serving /metrics (shared/metrics_server.h).
struct MetricsConfig {
  bool enabled = false;
  std::uint16_t port_base = 9400;  // ps i: port_base + i; worker j: after the servers
  // s a process keeps serving once its work is over, until a scrape has
  // read its final values; 0: it exits at once.
  double linger_s = 0;
};

// Each ps's shard also kept by the next ps of the ring (docs/failures.md,
// "Replicated shards"): the primary acknowledges an update once its backup
// has applied it too.
struct ReplicationConfig {
  std::uint32_t replicas = 1;  // copies of every shard: 1 (none besides the ps's own) or 2
  // s a backup may leave a forwarded update unanswered before its primary
  // serves on without it (the shard then has one copy).
  double backup_silence = 2;
};

struct ClusterConfig {
  std::string job = "pstrain";
  std::filesystem::path run_dir;  // default runs/<job>
  Mode mode = Mode::async;
  std::vector<PsEndpoint> ps;
  // `ps: {count: N}`: the file leaves every host to the scheduler
  // (shared/scheduler_env.h); ps[i].host and workers[i].host stay empty
  // (ports port_base + i) until fill_hosts(). Written as {count, port_base}
  // while pending, as the filled lists after, so the hash is over the hosts.
  bool hosts_pending = false;
  std::vector<WorkerSpec> workers;
  bool workers_auto = false;  // `workers: auto`, unresolved
  OptimizerConfig optimizer;
  // Embedding tables (`tables:`), sharded by row over every ps
  // (docs/embeddings.md).
  std::vector<TableSpec> tables = {};
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  NetConfig net;
  CheckpointConfig checkpoint;
  SecurityConfig security;
  MetricsConfig metrics;
  ReplicationConfig replication;
  // Not a config key and not part of hash() or to_yaml(): the nonce of this
  // launch (`pstrain --run-id`, which tools/launch draws afresh for every
  // launch and gives every process of it, restarts included). 0: none given.
  std::uint64_t launch_nonce = 0;

  // Hash of the canonical resolved configuration; all processes of a run must
  // agree on it (checked in hello), and checkpoints record it.
  std::uint64_t hash() const;
  // The run id every request carries (wire::Header::run_id): the config hash
  // mixed with the launch nonce, so that a process of another launch of the
  // same config is refused; the config hash alone without a nonce (then
  // stale processes of an earlier run of the same config are accepted).
  std::uint64_t run_id() const;
  // Fills pending hosts: ps i at ps_hosts[i] (on ps_ports[i] when given, else
  // the port_base + i it has), worker i at worker_hosts[i]. Throws
  // ConfigError when nothing is pending or a list has the wrong length.
  void fill_hosts(const std::vector<std::string>& ps_hosts,
                  const std::vector<std::optional<std::uint16_t>>& ps_ports,
                  const std::vector<std::string>& worker_hosts);
  // The resolved configuration as YAML, as written to run_dir/config.yaml.
  std::string to_yaml() const;
};

// Loads `path`, applies `overrides` ("dotted.key=value", values parsed as
// YAML scalars, sequence indices as numbers: "workers.1.device=cpu") and
// validates. Throws ConfigError.
ClusterConfig load_config(const std::filesystem::path& path,
                          const std::vector<std::string>& overrides = {});
// The same from YAML text; `origin` names the source in error messages.
ClusterConfig parse_config(const std::string& yaml_text,
                           const std::vector<std::string>& overrides = {},
                           const std::string& origin = "<string>");

// The keys whose values differ between two configurations given as YAML
// (to_yaml() output), as "dotted.key: A vs B" joined by "; ", at most `limit`
// of them; "" when none differ. Tells a user which --set or file edit made
// two processes of a run disagree.
std::string config_differences(const std::string& a_yaml, const std::string& b_yaml,
                               std::size_t limit = 5);
// The same naming only the keys ("dotted.key, other.key"), for a peer that
// must not learn our values (an unauthenticated hello).
std::string config_difference_keys(const std::string& a_yaml, const std::string& b_yaml,
                                   std::size_t limit = 5);

// The port of a process's /metrics endpoint (metrics.port_base): ps i on
// port_base + i, worker j on port_base + (number of ps) + j. `ps`: whether
// the process is a ps.
std::uint16_t metrics_port(const ClusterConfig& config, bool ps, std::uint32_t index);

// Every dotted key the schema accepts, list entries as N ("ps.N.port",
// "workers.count", "train.seed"), in the order to_yaml writes them; the
// documentation test checks that docs/config.md describes each.
std::vector<std::string> config_keys();

std::string_view to_string(Mode mode);
std::string_view to_string(Device device);
// The threads ps `ps_index` applies a large chunk's update with:
// optimizer.apply_threads, or under auto the cores of its host (`cores`)
// that the run's processes there leave over (each worker on the host takes
// train.threads of them, or one with a GPU, and each ps one), shared out among
// the ps on it, plus its own; at least 1. Hosts are compared as the file
// spells them; a worker whose host the scheduler gives counts as elsewhere.
std::uint32_t ps_apply_threads(const ClusterConfig& config, std::uint32_t ps_index, unsigned cores);
std::string_view to_string(WorkerLoss loss);
// Inline: libpstrain_cuda.so, which links none of pstrain_shared, names
// precisions in its messages (client/compute/backend.h).
inline std::string_view to_string(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "unknown";
}
std::string_view to_string(WireDType type);

}  // namespace pstrain
