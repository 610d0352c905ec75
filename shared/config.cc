#include "shared/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "shared/config_field.h"
#include "shared/config_override.h"
#include "shared/init.h"
#include "shared/modes.h"
#include "shared/protocol.h"
#include "shared/shard_map.h"

// The schema: one field table per section (shared/config_field.h says how a
// table is read and written). Reading, range checks, to_yaml and
// config_keys() all go through the tables.

namespace pstrain {

std::string PsEndpoint::connect_address() const {
  // ZeroMQ wants IPv6 literals in brackets.
  const bool ipv6 = host.find(':') != std::string::npos;
  return "tcp://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string PsEndpoint::bind_address() const {
  PsEndpoint listen = *this;
  if (!bind.empty()) listen.host = bind;
  return listen.connect_address();
}

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::async:
      return "async";
    case Mode::sync:
      return "sync";
    case Mode::ssp:
      return "ssp";
    case Mode::backup:
      return "backup";
    case Mode::local_sgd:
      return "local";
  }
  return "unknown";
}

std::string_view to_string(WorkerLoss loss) {
  return loss == WorkerLoss::fail ? "fail" : "continue";
}

std::string_view to_string(WireDType type) {
  switch (type) {
    case WireDType::fp32:
      return "fp32";
    case WireDType::bf16:
      return "bf16";
    case WireDType::fp16:
      return "fp16";
  }
  return "unknown";
}

std::string_view to_string(Device device) {
  switch (device) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
    case Device::auto_:
      return "auto";
    case Device::emulated:
      return "emulated";
  }
  return "unknown";
}

namespace {

using namespace config_detail;

// ---- The field tables, one per section, in the order to_yaml writes them.

// apply_threads: a number of threads, or auto (0): what the ps's host has
// to spare.
Field<OptimizerConfig> apply_threads_field() {
  return scalar(
      "apply_threads", &OptimizerConfig::apply_threads,
      [](const Reader& r, const YAML::Node& node, const std::string& path) {
        return node.IsScalar() && node.Scalar() == "auto"
                   ? 0u
                   : r.integer<std::uint32_t>(node, path, between(1, 256));
      },
      [](std::uint32_t threads) { return threads == 0 ? std::string("auto") : number(threads); });
}

// Keys of other optimizers are accepted so that --set optimizer.name=...
// can switch without editing the file.
const std::vector<Field<RowOptimizerConfig>> kSparseOptimizerFields = {
    choice("name", &RowOptimizerConfig::kind,
           {RowOptimizerKind::sgd, RowOptimizerKind::adagrad, RowOptimizerKind::rowwise_adagrad,
            RowOptimizerKind::lazy_adam, RowOptimizerKind::ftrl}),
    bounded("lr", &RowOptimizerConfig::lr, kPositive),
    bounded("eps", &RowOptimizerConfig::eps, kPositive),
    bounded("initial_accumulator", &RowOptimizerConfig::initial_accumulator, kNonNegative),
    bounded("beta1", &RowOptimizerConfig::beta1, kUnitOpen),
    bounded("beta2", &RowOptimizerConfig::beta2, kUnitOpen),
    bounded("beta", &RowOptimizerConfig::ftrl_beta, kNonNegative),
    bounded("l1", &RowOptimizerConfig::l1, kNonNegative),
    bounded("l2", &RowOptimizerConfig::l2, kNonNegative),
};

const std::vector<Field<OptimizerConfig>> kOptimizerFields = {
    choice(
        "name", &OptimizerConfig::kind,
        {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam, OptimizerKind::adagrad}),
    bounded("lr", &OptimizerConfig::lr, kPositive),
    bounded("momentum", &OptimizerConfig::momentum, kUnitOpen),
    flag("nesterov", &OptimizerConfig::nesterov),
    bounded("beta1", &OptimizerConfig::beta1, kUnitOpen),
    bounded("beta2", &OptimizerConfig::beta2, kUnitOpen),
    bounded("eps", &OptimizerConfig::eps, kPositive),
    bounded("initial_accumulator", &OptimizerConfig::initial_accumulator, kNonNegative),
    bounded("weight_decay", &OptimizerConfig::weight_decay, kNonNegative),
    flag("staleness_lr", &OptimizerConfig::staleness_lr),
    apply_threads_field(),
    section("sparse", &OptimizerConfig::sparse, kSparseOptimizerFields),
};

// An embedding table's rows: a number, or `dynamic` (any id).
Field<TableSpec> table_rows_field() {
  return scalar(
      "rows", &TableSpec::rows,
      [](const Reader& r, const YAML::Node& node,
         const std::string& path) -> std::optional<std::uint64_t> {
        if (node.IsScalar() && node.Scalar() == "dynamic") return std::nullopt;
        return r.integer<std::uint64_t>(node, path, at_least(1));
      },
      [](const std::optional<std::uint64_t>& rows) {
        return rows ? number(*rows) : std::string("dynamic");
      });
}

const std::vector<Field<TableSpec>> kTableFields = {
    required(text("name", &TableSpec::name), "the table's name"),
    required(bounded("dim", &TableSpec::dim, between(1, wire::kMaxRowWidth)),
             "the width of its rows"),
    table_rows_field(),
    bounded("max_rows_per_ps", &TableSpec::max_rows_per_ps, at_least(1)),
    bounded("admit_after", &TableSpec::admit_after, between(0, 254)),
    bounded("expire_after_s", &TableSpec::expire_after_s, kNonNegative),
};

// The embedding tables: a list of {name, dim, rows}; none by default (and
// then not written, so configs without tables keep their hash).
Field<ClusterConfig> tables_field() {
  std::vector<std::string> keys = {"tables"};
  for (const auto& key : keys_below("tables.N.", kTableFields)) keys.push_back(key);
  const auto read = [](const Reader& r, const YAML::Node& node, const std::string& path,
                       ClusterConfig& c) {
    if (!node.IsSequence())
      r.fail(path, "expected a list of tables {name, dim, rows}, got " + shown(node));
    c.tables = read_items(r, node, path, kTableFields);
    for (std::size_t i = 0; i < c.tables.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (c.tables[i].name == c.tables[j].name)
          r.fail(join(join(path, std::to_string(i)), "name"),
                 "table '" + c.tables[i].name + "' is also tables." + std::to_string(j));
  };
  const auto write = [](YAML::Emitter& out, const ClusterConfig& c) {
    write_items(out, kTableFields, c.tables);
  };
  return {.key = "tables",
          .read = read,
          .write = write,
          .keys = keys,
          .omitted = [](const ClusterConfig& c) { return c.tables.empty(); }};
}

const std::vector<Field<SyntheticCtrConfig>> kSyntheticCtrFields = {
    bounded("seed", &SyntheticCtrConfig::seed, at_least(0)),
    bounded("vocab_scale", &SyntheticCtrConfig::vocab_scale, kPositive),
    bounded("zipf_s", &SyntheticCtrConfig::zipf_s, kPositive),
    bounded("click_rate", &SyntheticCtrConfig::click_rate, Range{0, true, 1, true}),
};

// A key only some datasets read: written only for those, so that the
// canonical form (and the hash) of a run of another dataset is as before.
Field<DataConfig> used_by(Field<DataConfig> field, std::vector<std::string> datasets) {
  field.omitted = [datasets = std::move(datasets)](const DataConfig& d) {
    return std::find(datasets.begin(), datasets.end(), d.name) == datasets.end();
  };
  return field;
}

// A criteo file, which may be left out: empty (none) is not written.
Field<DataConfig> data_file_field(std::string key, std::filesystem::path DataConfig::*member) {
  Field<DataConfig> field = text(std::move(key), member);
  field.omitted = [member](const DataConfig& d) {
    return d.name != "criteo" || (d.*member).empty();
  };
  return field;
}

const std::vector<Field<DataConfig>> kDataFields = {
    choice("name", &DataConfig::name,
           {"fashion-mnist", "synthetic", "synthetic-ids", "criteo", "synthetic-ctr"}),
    text("dir", &DataConfig::dir),
    bounded("synthetic_train", &DataConfig::synthetic_train, at_least(1)),
    bounded("synthetic_test", &DataConfig::synthetic_test, at_least(1)),
    // That criteo has its files: checked across sections (check_data).
    data_file_field("train", &DataConfig::train),
    data_file_field("test", &DataConfig::test),
    used_by(bounded("test_fraction", &DataConfig::test_fraction, kUnitOpen), {"criteo"}),
    used_by(flag("skip_bad_lines", &DataConfig::skip_bad_lines), {"criteo"}),
    used_by(flag("log_integers", &DataConfig::log_integers), {"criteo", "synthetic-ctr"}),
    used_by(bounded("block_lines", &DataConfig::block_lines, at_least(1)), {"criteo"}),
    used_by(section("synthetic_ctr", &DataConfig::synthetic_ctr, kSyntheticCtrFields),
            {"synthetic-ctr"}),
};

// straggler_worker: an index, -1 (none) or all (kEveryWorker), so that a
// comparison can slow every worker at random.
Field<TrainConfig> straggler_worker_field() {
  return scalar(
      "straggler_worker", &TrainConfig::straggler_worker,
      [](const Reader& r, const YAML::Node& node, const std::string& path) {
        return node.IsScalar() && node.Scalar() == "all"
                   ? kEveryWorker
                   : r.integer<std::int32_t>(node, path, at_least(-1));
      },
      [](std::int32_t worker) {
        return worker == kEveryWorker ? std::string("all") : number(worker);
      });
}

const std::vector<Field<TrainConfig>> kTrainFields = {
    bounded("batch_size", &TrainConfig::batch_size, at_least(1)),
    bounded("epochs", &TrainConfig::epochs, kPositive),
    bounded("seed", &TrainConfig::seed, at_least(0)),
    bounded("eval_every", &TrainConfig::eval_every, at_least(0)),
    bounded("threads", &TrainConfig::threads, at_least(1)),
    bounded("sync_every", &TrainConfig::sync_every, at_least(1)),
    flag("lr_scaling", &TrainConfig::lr_scaling),
    bounded("warmup_steps", &TrainConfig::warmup_steps, at_least(0)),
    // Whether it names a worker is checked across sections (check_across).
    straggler_worker_field(),
    bounded("straggler_delay_ms", &TrainConfig::straggler_delay_ms, kNonNegative),
    bounded("straggler_jitter_ms", &TrainConfig::straggler_jitter_ms, kNonNegative),
    bounded("straggler_pause_probability", &TrainConfig::straggler_pause_probability,
            between(0, 1)),
    bounded("straggler_pause_ms", &TrainConfig::straggler_pause_ms, kNonNegative),
    // Whether a worker is emulated: checked across sections (check_across).
    bounded("emulated_step_ms", &TrainConfig::emulated_step_ms, kNonNegative),
    bounded("bucket_bytes", &TrainConfig::bucket_bytes, at_least(4)),
    bounded("staleness_bound", &TrainConfig::staleness_bound, at_least(0)),
    // Fewer than the workers: checked across sections (check_across).
    bounded("backup_workers", &TrainConfig::backup_workers, at_least(0)),
    bounded("local_steps", &TrainConfig::local_steps, at_least(1)),
    choice("on_worker_loss", &TrainConfig::on_worker_loss,
           {WorkerLoss::continue_, WorkerLoss::fail}),
    bounded("accumulate_steps", &TrainConfig::accumulate_steps, at_least(1)),
    bounded("prefetch", &TrainConfig::prefetch, between(0, 1)),
    // Only through the ps: checked across sections (check_across).
    bounded("pipeline", &TrainConfig::pipeline, between(0, 1)),
    bounded("weight_prediction", &TrainConfig::weight_prediction, between(0, 4)),
    choice("precision", &TrainConfig::precision,
           {Precision::fp32, Precision::bf16, Precision::fp16}),
    flag("cuda_graphs", &TrainConfig::cuda_graphs),
    bounded("trace_steps", &TrainConfig::trace_steps, at_least(1)),
    bounded("trace_skip", &TrainConfig::trace_skip, at_least(0)),
};

const std::vector<Field<FaultConfig>> kFaultFields = {
    bounded("drop", &FaultConfig::drop, kUnitOpen),
    bounded("delay_ms", &FaultConfig::delay_ms, kNonNegative),
};

// net.compression: none, sign or topk:RATIO (shared/gradient_compression.h).
Field<NetConfig> compression_field() {
  return scalar(
      "compression", &NetConfig::compression,
      [](const Reader& r, const YAML::Node& node, const std::string& path) {
        try {
          return parse_compression(r.text(node, path));
        } catch (const std::invalid_argument& e) {
          r.fail(path, e.what());
        }
      },
      [](const Compression& c) { return to_string(c); });
}

const std::vector<Field<NetConfig>> kNetFields = {
    bounded("chunk_bytes", &NetConfig::chunk_bytes, between(4, ShardMap::kMaxChunkBytes)),
    bounded("request_timeout", &NetConfig::request_timeout, kPositive),
    bounded("retry_interval", &NetConfig::retry_interval, kPositive),
    bounded("worker_timeout", &NetConfig::worker_timeout, kPositive),
    // Shorter than worker_timeout: checked across sections.
    bounded("heartbeat", &NetConfig::heartbeat, kPositive),
    choice("wire_dtype", &NetConfig::wire_dtype,
           {WireDType::fp32, WireDType::bf16, WireDType::fp16}),
    bounded("io_threads", &NetConfig::io_threads, between(0, 64)),
    // Only for pushes to the ps: checked across sections (check_across).
    compression_field(),
    section("fault", &NetConfig::fault, kFaultFields),
};

const std::vector<Field<CheckpointConfig>> kCheckpointFields = {
    bounded("every_s", &CheckpointConfig::every_s, kNonNegative),
    bounded("keep", &CheckpointConfig::keep, at_least(1)),
    flag("incremental", &CheckpointConfig::incremental),
    bounded("full_every", &CheckpointConfig::full_every, at_least(1)),
};

const std::vector<Field<SecurityConfig>> kSecurityFields = {
    flag("curve", &SecurityConfig::curve),
    text("keys", &SecurityConfig::keys),
};

const std::vector<Field<MetricsConfig>> kMetricsFields = {
    flag("enabled", &MetricsConfig::enabled),
    // That every port fits, and none is a ps's: checked across sections.
    bounded("port_base", &MetricsConfig::port_base, between(1, 65535)),
    bounded("linger_s", &MetricsConfig::linger_s, kNonNegative),
};

const std::vector<Field<ReplicationConfig>> kReplicationFields = {
    // With two ps at least, in modes async, sync and ssp: checked across sections.
    bounded("replicas", &ReplicationConfig::replicas, between(1, 2)),
    bounded("backup_silence", &ReplicationConfig::backup_silence, kPositive),
};

// Left out of the canonical file (and so of the config hash) while off, so
// that runs without replication keep their run ids and checkpoints.
Field<ClusterConfig> replication_field() {
  auto field = section("replication", &ClusterConfig::replication, kReplicationFields);
  field.omitted = [](const ClusterConfig& c) { return c.replication.replicas == 1; };
  return field;
}

const std::vector<Field<PsEndpoint>> kPsFields = {
    required(text("host", &PsEndpoint::host), "the address others dial"),
    required(bounded("port", &PsEndpoint::port, between(1, 65535)), ""),
    // Written as the address actually bound, so the canonical form says
    // where the server listens.
    written_as(text("bind", &PsEndpoint::bind),
               [](const PsEndpoint& p) { return p.bind.empty() ? p.host : p.bind; }),
};

// gpu: an index, or auto (-1): the launcher gives each CUDA worker on a host
// its own.
Field<WorkerSpec> gpu_field() {
  return scalar(
      "gpu", &WorkerSpec::gpu,
      [](const Reader& r, const YAML::Node& node, const std::string& path) {
        return node.IsScalar() && node.Scalar() == "auto" ? -1
                                                          : r.integer<int>(node, path, at_least(0));
      },
      [](int gpu) { return gpu < 0 ? std::string("auto") : number(gpu); });
}

// Where the file leaves a worker's host out it is 127.0.0.1, or the
// scheduler's (hosts_pending), and not written until filled.
Field<WorkerSpec> worker_host_field() {
  Field<WorkerSpec> field = text("host", &WorkerSpec::host);
  field.omitted = [](const WorkerSpec& w) { return w.host.empty(); };
  return field;
}

const std::vector<Field<WorkerSpec>> kWorkerFields = {
    worker_host_field(),
    choice("device", &WorkerSpec::device,
           {Device::cpu, Device::cuda, Device::auto_, Device::emulated}),
    gpu_field(),
};

// The shorthand `workers: {count, host, device}`: count identical workers.
struct WorkerGroup {
  std::uint32_t count = 0;
  WorkerSpec spec;
};

// The shorthand `ps: {count: N, port_base, bind}`: N servers whose hosts
// the scheduler gives (shared/scheduler_env.h), on ports port_base + i.
struct PsGroup {
  std::uint32_t count = 0;
  std::uint16_t port_base = 7100;  // the port of the example cluster.yaml's ps 0
  // A scheduler's host is a name, which ZeroMQ cannot bind (it reads it as
  // an interface), and in Kubernetes it resolves only once the pod is ready.
  std::string bind = "0.0.0.0";
};

const std::vector<Field<PsGroup>> kPsGroupFields = {
    required(bounded("count", &PsGroup::count, between(1, 65535)), "how many parameter servers"),
    bounded("port_base", &PsGroup::port_base, between(1, 65535)),
    text("bind", &PsGroup::bind),
};

// count, then every key of a worker but gpu: identical workers on one host
// must not share one GPU, so the launcher assigns them.
std::vector<Field<WorkerGroup>> worker_group_fields() {
  // Bounded by the port space: in sync mode every worker listens on its own port.
  std::vector<Field<WorkerGroup>> fields = {
      required(bounded("count", &WorkerGroup::count, between(1, 65535)), "how many workers")};
  for (const auto& f : kWorkerFields)
    if (f.key != "gpu") fields.push_back(inside(&WorkerGroup::spec, f));
  return fields;
}

const std::vector<Field<WorkerGroup>> kWorkerGroupFields = worker_group_fields();

// A layer type and the sizes it takes; each type takes exactly its own, so
// a misplaced key is reported rather than silently ignored.
struct LayerKind {
  std::string type;
  std::vector<Field<ModelLayer>> fields;  // type first, then the sizes
};

// A list of scalars in one member, each read by `item`, written on one line.
template <class S, class T, class Item>
Field<S> list_of(std::string key, std::vector<T> S::*member, std::string what, Item item) {
  std::vector<std::string> keys = {key};
  return {.key = std::move(key),
          .read =
              [member, what, item](const Reader& r, const YAML::Node& node, const std::string& path,
                                   S& s) {
                if (!node.IsSequence()) r.fail(path, "expected " + what + ", got " + shown(node));
                (s.*member).clear();
                for (std::size_t i = 0; i < node.size(); ++i)
                  (s.*member).push_back(item(r, node[i], join(path, std::to_string(i))));
              },
          .write =
              [member](YAML::Emitter& out, const S& s) {
                out << YAML::Flow << YAML::BeginSeq;
                for (const T& value : s.*member) out << value;
                out << YAML::EndSeq;
              },
          .keys = std::move(keys)};
}

// The same field, left out of the written file when `left_out` says so (a
// value the layer did not need), so older files keep their hash.
template <class S, class LeftOut>
Field<S> unless(Field<S> field, LeftOut left_out) {
  field.omitted = left_out;
  return field;
}

// Every layer may be named and read other layers than the one before it
// (client/model/model.h): `name`, `inputs`.
void add_wiring(LayerKind& kind, bool inputs_required) {
  kind.fields.push_back(
      unless(text("name", &ModelLayer::name), [](const ModelLayer& l) { return l.name.empty(); }));
  // An embedding layer reads the sample's ids, no layer.
  if (kind.type == "embedding" || kind.type == "embedding_bag") return;
  Field<ModelLayer> inputs = list_of("inputs", &ModelLayer::inputs, "a list of layer names",
                                     [](const Reader& r, const YAML::Node& node,
                                        const std::string& path) { return r.text(node, path); });
  kind.fields.push_back(
      inputs_required
          ? required(inputs, "required for a " + kind.type + " layer: the layers it joins")
          : unless(inputs, [](const ModelLayer& l) { return l.inputs.empty(); }));
}

LayerKind layer_kind(const std::string& type,
                     const std::vector<std::pair<std::string, int ModelLayer::*>>& sizes) {
  LayerKind kind{type, {text("type", &ModelLayer::type)}};
  for (const auto& [key, member] : sizes) {
    kind.fields.push_back(
        required(bounded(key, member, at_least(1)), "required for a " + type + " layer"));
  }
  add_wiring(kind, type == "concat" || type == "dot_interaction");
  return kind;
}

// Embedding layers (docs/embeddings.md): `ids` ids per sample looked up in
// `table`, each id its own columns (embedding) or pooled into one row
// (embedding_bag, by `pool`), from the sample's id `first_id` on.
LayerKind embedding_kind(const std::string& type, bool bag) {
  LayerKind kind = layer_kind(type, {{"ids", &ModelLayer::ids}});
  kind.fields.push_back(
      required(text("table", &ModelLayer::table), "required for an " + type + " layer"));
  if (bag) kind.fields.push_back(choice("pool", &ModelLayer::pool, {"sum", "mean"}));
  kind.fields.push_back(unless(bounded("first_id", &ModelLayer::first_id, between(0, 65535)),
                               [](const ModelLayer& l) { return l.first_id < 0; }));
  return kind;
}

const std::vector<LayerKind> kLayerKinds = {
    layer_kind("dense", {{"units", &ModelLayer::units}}),
    layer_kind("relu", {}),
    layer_kind("conv2d", {{"filters", &ModelLayer::filters}, {"kernel", &ModelLayer::kernel}}),
    layer_kind("maxpool2d", {{"kernel", &ModelLayer::kernel}}),
    layer_kind("flatten", {}),
    layer_kind("concat", {}),
    layer_kind("dot_interaction", {}),
    embedding_kind("embedding", false),
    embedding_kind("embedding_bag", true),
};

const LayerKind& layer_kind_of(const std::string& type) {
  for (const auto& kind : kLayerKinds)
    if (kind.type == type) return kind;
  throw std::logic_error("model layer type '" + type + "' is not in kLayerKinds");
}

// ---- The root's fields that are not plain sections.

Field<ClusterConfig> job_field() {
  // A plain name: it becomes part of file names (runs/<job>).
  return scalar(
      "job", &ClusterConfig::job,
      [](const Reader& r, const YAML::Node& node, const std::string& path) {
        std::string job = r.text(node, path);
        const auto name_char = [](unsigned char ch) {
          return std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-';
        };
        if (!std::all_of(job.begin(), job.end(), name_char)) {
          r.fail(path, "expected a name of letters, digits, '.', '_' and '-', got '" + job + "'");
        }
        return job;
      },
      [](const std::string& job) { return job; });
}

Field<ClusterConfig> run_dir_field() {
  Field<ClusterConfig> field = text("run_dir", &ClusterConfig::run_dir);
  // The root table reads job first.
  field.absent = [](const Reader&, const std::string&, ClusterConfig& c) {
    c.run_dir = std::filesystem::path("runs") / c.job;
  };
  return field;
}

Field<ClusterConfig> ps_field() {
  std::vector<std::string> keys = {"ps"};
  for (const auto& key : keys_below("ps.N.", kPsFields)) keys.push_back(key);
  for (const auto& key : keys_below("ps.", kPsGroupFields)) keys.push_back(key);
  const auto read = [](const Reader& r, const YAML::Node& node, const std::string& path,
                       ClusterConfig& c) {
    if (node.IsMap()) {
      PsGroup group;
      read_map(r, node, path, kPsGroupFields, group);
      if (group.port_base + group.count - 1 > 65535) {
        r.fail(join(path, "port_base"), "port_base + count - 1 must be at most 65535");
      }
      c.hosts_pending = true;
      for (std::uint32_t i = 0; i < group.count; ++i) {
        c.ps.push_back(PsEndpoint{.host = "",
                                  .port = static_cast<std::uint16_t>(group.port_base + i),
                                  .bind = group.bind});
      }
      return;
    }
    if (!node.IsSequence() || node.size() == 0) {
      r.fail(path, "expected a non-empty list of {host, port} or {count: N}, got " + shown(node));
    }
    c.ps = read_items(r, node, path, kPsFields);
    std::map<std::string, std::size_t> seen;  // "host:port" -> first index
    for (std::size_t i = 0; i < c.ps.size(); ++i) {
      const std::string endpoint = c.ps[i].host + ":" + std::to_string(c.ps[i].port);
      if (auto [it, fresh] = seen.emplace(endpoint, i); !fresh) {
        r.fail(join(path, std::to_string(i)),
               "duplicate endpoint " + endpoint + " (also ps." + std::to_string(it->second) + ")");
      }
    }
  };
  const auto write = [](YAML::Emitter& out, const ClusterConfig& c) {
    if (!c.hosts_pending) {
      write_items(out, kPsFields, c.ps);
      return;
    }
    PsGroup group{.count = static_cast<std::uint32_t>(c.ps.size()),
                  .port_base = c.ps.front().port,
                  .bind = c.ps.front().bind};
    out << YAML::Flow << YAML::BeginMap;
    write_fields(out, kPsGroupFields, group);
    out << YAML::EndMap;
  };
  return required(Field<ClusterConfig>{.key = "ps", .read = read, .write = write, .keys = keys},
                  "the list of parameter servers, [{host, port}, ...], or {count: N}");
}

// A list of workers, the shorthand {count, ...} or `auto` (left for the
// launcher).
Field<ClusterConfig> workers_field() {
  std::vector<std::string> keys = {"workers"};
  for (const auto& key : keys_below("workers.N.", kWorkerFields)) keys.push_back(key);
  for (const auto& key : keys_below("workers.", kWorkerGroupFields)) keys.push_back(key);
  const auto read = [](const Reader& r, const YAML::Node& node, const std::string& path,
                       ClusterConfig& c) {
    if (node.IsScalar() && node.Scalar() == "auto") {
      c.workers_auto = true;
    } else if (node.IsMap()) {
      WorkerGroup group;
      read_map(r, node, path, kWorkerGroupFields, group);
      c.workers.assign(group.count, group.spec);
    } else if (node.IsSequence() && node.size() > 0) {
      c.workers = read_items(r, node, path, kWorkerFields);
    } else {
      r.fail(path,
             "expected a non-empty list of {host, device, gpu}, a map {count, host, device} "
             "or 'auto', got " +
                 shown(node));
    }
  };
  const auto write = [](YAML::Emitter& out, const ClusterConfig& c) {
    if (c.workers_auto) {
      out << "auto";
    } else {
      write_items(out, kWorkerFields, c.workers);
    }
  };
  return required(
      Field<ClusterConfig>{.key = "workers", .read = read, .write = write, .keys = keys},
      "a list of workers, {count: N} or auto");
}

// The mode, which also gives train.on_worker_loss its default: an async run
// goes on without a lost worker, a sync run cannot. The root table reads
// train after mode, so a value given there wins.
Field<ClusterConfig> mode_field() {
  Field<ClusterConfig> field =
      choice("mode", &ClusterConfig::mode,
             {Mode::async, Mode::sync, Mode::ssp, Mode::backup, Mode::local_sgd});
  field.read = [read = field.read](const Reader& r, const YAML::Node& node, const std::string& path,
                                   ClusterConfig& c) {
    read(r, node, path, c);
    c.train.on_worker_loss = traits(c.mode).on_worker_loss;
  };
  return field;
}

Field<ModelConfig> unit_counts(std::string key, std::vector<int> ModelConfig::*member) {
  return list_of(std::move(key), member, "a list of unit counts",
                 [](const Reader& r, const YAML::Node& node, const std::string& path) {
                   return r.integer<int>(node, path, at_least(1));
                 });
}

// The map form's keys beside `preset` or `layers`: the loss and the
// click-through presets' sizes (docs/ctr.md).
const std::vector<Field<ModelConfig>> kModelMapFields = {
    choice("loss", &ModelConfig::loss, std::vector<std::string>{"auto", "softmax", "bce"}),
    bounded("embedding_dim", &ModelConfig::embedding_dim, between(1, 4096)),
    unit_counts("bottom_mlp", &ModelConfig::bottom_mlp),
    unit_counts("top_mlp", &ModelConfig::top_mlp),
    unit_counts("deep_mlp", &ModelConfig::deep_mlp),
};

const std::vector<std::string> kPresets = {"mlp", "cnn", "dlrm", "wide_deep"};

// A custom model's list of layers, each a map of its type's keys.
void read_layers(const Reader& r, const YAML::Node& node, const std::string& path,
                 ModelConfig& model) {
  if (!node.IsSequence() || node.size() == 0)
    r.fail(path, "expected " + listed(kPresets, ", ") + " or a non-empty list of layers, got " +
                     shown(node));
  std::vector<std::string> types;
  std::string spelled;  // dense|relu|...
  for (const auto& kind : kLayerKinds) {
    spelled += (types.empty() ? "" : "|") + kind.type;
    types.push_back(kind.type);
  }
  model.preset = "custom";
  for (std::size_t i = 0; i < node.size(); ++i) {
    const std::string at = join(path, std::to_string(i));
    const YAML::Node entry = node[i];
    if (!entry.IsMap() || !entry["type"]) {
      r.fail(at, "expected a layer {type: " + spelled + ", ...}, got " + shown(entry));
    }
    const std::string type = r.choice(entry["type"], join(at, "type"), types);
    ModelLayer layer;
    read_map(r, entry, at, layer_kind_of(type).fields, layer);
    model.layers.push_back(std::move(layer));
  }
}

void write_layers(YAML::Emitter& out, const ModelConfig& model) {
  out << YAML::BeginSeq;
  for (const auto& layer : model.layers) {
    out << YAML::Flow << YAML::BeginMap;
    write_fields(out, layer_kind_of(layer.type).fields, layer);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

// A preset's name, a custom model as a list of layers, or a map of either
// (`preset` or `layers`) with the loss and the presets' sizes.
Field<ClusterConfig> model_field() {
  std::vector<std::string> keys = {"model", "model.preset", "model.layers"};
  for (const auto& key : keys_below("model.", kModelMapFields)) keys.push_back(key);
  for (const auto& kind : kLayerKinds) {
    for (const auto& key : keys_below("model.N.", kind.fields)) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  const auto read = [](const Reader& r, const YAML::Node& node, const std::string& path,
                       ClusterConfig& c) {
    if (node.IsScalar()) {
      c.model.preset = r.choice(node, path, kPresets);
      return;
    }
    if (!node.IsMap()) return read_layers(r, node, path, c.model);
    std::vector<std::string> map_keys = {"preset", "layers"};
    for (const auto& key : names(kModelMapFields)) map_keys.push_back(key);
    r.keys(node, path, map_keys, map_of(map_keys));
    if (node["preset"] && node["layers"]) r.fail(path, "give either preset or layers, not both");
    if (node["preset"]) {
      c.model.preset = r.choice(node["preset"], join(path, "preset"), kPresets);
    } else if (node["layers"]) {
      read_layers(r, node["layers"], join(path, "layers"), c.model);
    } else {
      r.fail(join(path, "preset"), "missing (a preset, or layers: a list of layers)");
    }
    read_fields(r, node, path, kModelMapFields, c.model);
  };
  const auto write = [](YAML::Emitter& out, const ClusterConfig& c) {
    const bool ctr = c.model.preset == "dlrm" || c.model.preset == "wide_deep";
    if (!ctr && c.model.loss == "auto") {
      if (c.model.preset != "custom") {
        out << c.model.preset;
      } else {
        write_layers(out, c.model);
      }
      return;
    }
    out << YAML::BeginMap;
    if (c.model.preset != "custom") {
      out << YAML::Key << "preset" << YAML::Value << c.model.preset;
    } else {
      out << YAML::Key << "layers" << YAML::Value;
      write_layers(out, c.model);
    }
    write_fields(out, kModelMapFields, c.model);
    out << YAML::EndMap;
  };
  return {.key = "model", .read = read, .write = write, .keys = keys};
}

// The click-through presets look their ids up in tables of fixed names
// (shared/config.h): a run gets them unless `tables` has them already, in
// which case their widths must fit.
void add_preset_tables(const Reader& r, ClusterConfig& c) {
  const auto need = [&](std::string_view name, std::uint32_t dim) {
    const auto table = std::ranges::find(c.tables, name, &TableSpec::name);
    if (table == c.tables.end()) {
      TableSpec spec;
      spec.name = std::string(name);
      spec.dim = dim;
      c.tables.push_back(std::move(spec));
    } else if (table->dim != dim) {
      r.fail(join(join("tables", std::to_string(table - c.tables.begin())), "dim"),
             "the " + c.model.preset + " model looks up rows of " + std::to_string(dim) +
                 " floats in table '" + std::string(name) + "', got " + std::to_string(table->dim));
    }
  };
  if (c.model.preset != "dlrm" && c.model.preset != "wide_deep") return;
  need(kCtrTable, static_cast<std::uint32_t>(c.model.embedding_dim));
  if (c.model.preset == "wide_deep") need(kCtrWideTable, 1);
}

const std::vector<Field<ClusterConfig>> kRootFields = {
    job_field(),
    run_dir_field(),
    mode_field(),
    ps_field(),
    workers_field(),
    section("optimizer", &ClusterConfig::optimizer, kOptimizerFields),
    tables_field(),
    model_field(),
    section("data", &ClusterConfig::data, kDataFields),
    section("train", &ClusterConfig::train, kTrainFields),
    section("net", &ClusterConfig::net, kNetFields),
    section("checkpoint", &ClusterConfig::checkpoint, kCheckpointFields),
    section("security", &ClusterConfig::security, kSecurityFields),
    section("metrics", &ClusterConfig::metrics, kMetricsFields),
    replication_field(),
};

const std::string kRootWhat = "a map of settings (job, ps, workers, ...)";

// With metrics on, every process's port exists and none is a ps's own
// (a ps would fail to bind one of them). Under workers: auto the count is
// the launcher's, which checks the resolved file again.
void check_metrics_ports(const Reader& r, const ClusterConfig& c) {
  if (!c.metrics.enabled) return;
  const std::size_t processes = c.ps.size() + (c.workers_auto ? 0 : c.workers.size());
  if (c.metrics.port_base + processes - 1 > 65535)
    r.fail("metrics.port_base", "port_base + " + std::to_string(processes - 1) +
                                    " (one port per ps and worker) must be at most 65535");
  for (std::size_t i = 0; i < c.ps.size(); ++i)
    if (c.ps[i].port >= c.metrics.port_base && c.ps[i].port < c.metrics.port_base + processes)
      r.fail("metrics.port_base", "the metrics ports " + number(c.metrics.port_base) + ".." +
                                      number(c.metrics.port_base + processes - 1) + " include ps " +
                                      std::to_string(i) + "'s port " + number(c.ps[i].port));
}

// criteo reads its splits from files: data.train always, data.test unless
// data.test_fraction takes the test split from data.train.
void check_data(const Reader& r, const DataConfig& d) {
  if (d.name != "criteo") return;
  if (d.train.empty())
    r.fail("data.train",
           "missing (data.name criteo reads its training set from this file: Criteo's TSV, plain "
           "or gzip; docs/ctr.md)");
  if (d.test.empty() && d.test_fraction == 0)
    r.fail("data.test",
           "missing (data.name criteo needs a test file, or data.test_fraction > 0 to hold out "
           "that fraction of data.train's line blocks; docs/ctr.md)");
}

// Replicas are forwarded by each ps to the next: there must be one, and
// what is forwarded must be all the shard holds (mode local trains without
// the ps).
void check_replication(const Reader& r, const ClusterConfig& c) {
  if (c.replication.replicas == 1) return;
  if (c.ps.size() < 2)
    r.fail("replication.replicas",
           "2 needs two ps at least (the cluster has " + std::to_string(c.ps.size()) + ")");
  if (c.mode == Mode::local_sgd)
    r.fail("replication.replicas", "2 applies to modes async, sync, ssp and backup, not to mode " +
                                       std::string(to_string(c.mode)));
  if (!(c.replication.backup_silence < c.net.request_timeout))
    r.fail("replication.backup_silence",
           "must be shorter than net.request_timeout (" + number(c.net.request_timeout) +
               " s): replies wait for a silent backup that long before the primary serves on");
  // A copy applies the primary's pushes in the primary's order, so its rows
  // follow only from them: not from the clock (expiry), and not from an
  // admission filter that a shard's state handed over does not carry.
  for (const auto& t : c.tables) {
    if (t.expire_after_s > 0)
      r.fail("replication.replicas",
             "2 cannot keep table '" + t.name +
                 "' with expire_after_s: each copy would expire rows by its own clock, and "
                 "the copies would differ (use max_rows_per_ps to bound it)");
    if (t.admit_after > 0)
      r.fail("replication.replicas",
             "2 cannot keep table '" + t.name +
                 "' with admit_after: the admission filter's counts are not part of a "
                 "shard's copy, so a re-joined ps would admit other rows than its backup");
  }
}

// Constraints between sections, checked once every section is read.
void check_across(const Reader& r, const ClusterConfig& c) {
  check_data(r, c.data);
  if (c.net.heartbeat >= c.net.worker_timeout) {
    r.fail("net.heartbeat", "must be shorter than net.worker_timeout (" +
                                number(c.net.worker_timeout) +
                                " s), or every ps would time out live workers");
  }
  check_metrics_ports(r, c);
  check_replication(r, c);
  if (c.workers_auto) {
    if (c.hosts_pending)
      r.fail("workers",
             "auto is resolved only by tools/launch; with ps: {count} give workers: {count: N}");
    return;
  }
  for (std::size_t i = 0; i < c.workers.size(); ++i) {
    if (c.hosts_pending && !c.workers[i].host.empty()) {
      r.fail(join(join("workers", std::to_string(i)), "host"),
             "leave it out: ps: {count} takes every host from the scheduler");
    }
  }
  // Backup puts a gradient in the step of the version it was computed on:
  // one a step older each time would be late every other step.
  if (c.train.pipeline > 0 && (traits(c.mode).allreduce() || c.mode == Mode::backup)) {
    r.fail("train.pipeline",
           "applies to modes async and ssp, not to mode " + std::string(to_string(c.mode)));
  }
  if (c.net.compression.kind != Compression::Kind::none && traits(c.mode).allreduce()) {
    r.fail("net.compression", "compresses pushes to the ps (modes async, ssp and backup); mode " +
                                  std::string(to_string(c.mode)) +
                                  " all-reduces between the workers");
  }
  const auto workers = static_cast<std::int64_t>(c.workers.size());
  if (c.mode == Mode::backup && c.train.backup_workers >= workers) {
    r.fail("train.backup_workers",
           std::to_string(c.train.backup_workers) + " leaves no gradient to wait for (there are " +
               std::to_string(workers) + " workers; each step waits for workers - backup_workers)");
  }
  const bool emulated = std::ranges::any_of(
      c.workers, [](const WorkerSpec& w) { return w.device == Device::emulated; });
  if (emulated && !(c.train.emulated_step_ms > 0)) {
    r.fail("train.emulated_step_ms",
           "give the time an emulated worker's step takes (ms > 0): a worker has device: "
           "emulated");
  } else if (!emulated && c.train.emulated_step_ms > 0) {
    r.fail("train.emulated_step_ms", "applies to workers with device: emulated; there is none");
  }
  if (c.train.straggler_worker >= workers) {
    r.fail("train.straggler_worker",
           std::to_string(c.train.straggler_worker) + " is not a worker index (there are " +
               std::to_string(workers) + " workers; -1: none, all: every one)");
  }
}

ClusterConfig read_config(const Reader& r, const YAML::Node& root) {
  r.keys(root, "", names(kRootFields), kRootWhat);
  ClusterConfig c;
  read_fields(r, root, "", kRootFields, c);
  add_preset_tables(r, c);
  check_across(r, c);
  if (!c.hosts_pending)
    for (auto& w : c.workers)
      if (w.host.empty()) w.host = "127.0.0.1";
  return c;
}

}  // namespace

ClusterConfig parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                           const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    const std::string where = e.mark.is_null() ? origin
                                               : origin + ":" + std::to_string(e.mark.line + 1) +
                                                     ":" + std::to_string(e.mark.column + 1);
    throw ConfigError(where + ": YAML syntax error: " + e.msg);
  }
  const Reader reader(origin);
  if (root.IsNull() || !root.IsDefined()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    reader.fail("", "expected " + kRootWhat + ", got " + shown(root));
  }
  for (const auto& item : overrides) apply_override(root, item);
  try {
    return read_config(reader, root);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin + ": " + e.what());
  }
}

ClusterConfig load_config(const std::filesystem::path& path,
                          const std::vector<std::string>& overrides) {
  const std::string origin = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw ConfigError(origin + ": no such file (give the cluster file with --cluster)");
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(origin + ": is a directory, expected a YAML file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(origin + ": cannot open (" + std::generic_category().message(errno) + ")");
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError(origin + ": read error");
  return parse_config(text, overrides, origin);
}

std::string ClusterConfig::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  write_fields(out, kRootFields, *this);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void ClusterConfig::fill_hosts(const std::vector<std::string>& ps_hosts,
                               const std::vector<std::optional<std::uint16_t>>& ps_ports,
                               const std::vector<std::string>& worker_hosts) {
  if (!hosts_pending) throw ConfigError("fill_hosts: the hosts are not pending");
  if (ps_hosts.size() != ps.size() || ps_ports.size() != ps.size() ||
      worker_hosts.size() != workers.size()) {
    throw ConfigError("the scheduler placed " + std::to_string(ps_hosts.size()) + " ps and " +
                      std::to_string(worker_hosts.size()) + " workers, the file asks for " +
                      std::to_string(ps.size()) + " and " + std::to_string(workers.size()));
  }
  for (std::size_t i = 0; i < ps.size(); ++i) {
    ps[i].host = ps_hosts[i];
    if (ps_ports[i]) ps[i].port = *ps_ports[i];
  }
  for (std::size_t i = 0; i < workers.size(); ++i) workers[i].host = worker_hosts[i];
  hosts_pending = false;
}

std::vector<std::string> config_keys() { return keys_below("", kRootFields); }

namespace {

std::string scalar_text(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "(absent)";
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

struct Difference {
  std::string key;     // dotted
  std::string values;  // "A vs B"
};

void diff_nodes(const YAML::Node& a, const YAML::Node& b, const std::string& path,
                std::vector<Difference>& out) {
  if (a.IsMap() && b.IsMap()) {
    std::vector<std::string> keys;
    for (const auto& kv : a) keys.push_back(kv.first.Scalar());
    for (const auto& kv : b)
      if (!a[kv.first.Scalar()]) keys.push_back(kv.first.Scalar());
    for (const auto& k : keys) diff_nodes(a[k], b[k], join(path, k), out);
    return;
  }
  if (a.IsSequence() && b.IsSequence() && a.size() == b.size()) {
    for (std::size_t i = 0; i < a.size(); ++i)
      diff_nodes(a[i], b[i], join(path, std::to_string(i)), out);
    return;
  }
  const auto at = scalar_text(a), bt = scalar_text(b);
  if (at != bt) out.push_back({path, at + " vs " + bt});
}

// The differing keys with their values, or nullopt when a text is not YAML.
std::optional<std::vector<Difference>> differences(const std::string& a_yaml,
                                                   const std::string& b_yaml) {
  std::vector<Difference> found;
  try {
    diff_nodes(YAML::Load(a_yaml), YAML::Load(b_yaml), "", found);
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
  return found;
}

std::string join_differences(const std::optional<std::vector<Difference>>& found, std::size_t limit,
                             bool with_values, const char* separator) {
  if (!found) return "(a configuration could not be read)";
  std::string text;
  for (std::size_t i = 0; i < found->size() && i < limit; ++i) {
    const auto& d = (*found)[i];
    text += (i ? separator : "") + d.key + (with_values ? ": " + d.values : "");
  }
  if (found->size() > limit)
    text += separator + std::string("and ") + std::to_string(found->size() - limit) + " more";
  return text;
}

}  // namespace

std::string config_differences(const std::string& a_yaml, const std::string& b_yaml,
                               std::size_t limit) {
  return join_differences(differences(a_yaml, b_yaml), limit, true, "; ");
}

std::string config_difference_keys(const std::string& a_yaml, const std::string& b_yaml,
                                   std::size_t limit) {
  return join_differences(differences(a_yaml, b_yaml), limit, false, ", ");
}

std::uint64_t ClusterConfig::hash() const { return fnv1a64(to_yaml()); }

std::uint64_t ClusterConfig::run_id() const {
  const auto h = hash();
  if (launch_nonce == 0) return h;
  // Any fixed mix does; one that cannot give 0 (the hello reply's run id) or
  // the bare hash (a process started without the nonce) keeps them apart.
  const auto id = fnv1a64(
      std::string_view(reinterpret_cast<const char*>(&launch_nonce), sizeof launch_nonce), h);
  return id == 0 || id == h ? id + 1 : id;
}

std::uint16_t metrics_port(const ClusterConfig& config, bool ps, std::uint32_t index) {
  const std::size_t offset = ps ? index : config.ps.size() + index;
  return static_cast<std::uint16_t>(config.metrics.port_base + offset);
}

double liveness_interval(const NetConfig& net) {
  return std::min(net.heartbeat, net.worker_timeout / 4);
}

double takeover_silence(const NetConfig& net) { return 3 * liveness_interval(net); }

std::uint32_t io_threads(std::uint32_t configured, std::uint32_t peers, std::uint32_t cores) {
  if (configured > 0) return configured;
  return std::clamp<std::uint32_t>(cores / 8, 1, std::max<std::uint32_t>(peers, 1));
}

std::uint32_t ps_apply_threads(const ClusterConfig& config, std::uint32_t ps_index,
                               unsigned cores) {
  if (config.optimizer.apply_threads != 0) return config.optimizer.apply_threads;
  const std::string& host = config.ps.at(ps_index).host;
  std::uint64_t busy = 0, servers = 0;
  for (const auto& ps : config.ps) servers += ps.host == host ? 1 : 0;
  for (const auto& w : config.workers) {
    const std::string& at = w.host.empty() && !config.hosts_pending ? "127.0.0.1" : w.host;
    // A GPU worker keeps a core feeding its device; an emulated one sleeps.
    if (at == host && w.device != Device::emulated)
      busy += w.device == Device::cuda ? 1 : config.train.threads;
  }
  busy += servers;
  const std::uint64_t spare = cores > busy ? cores - busy : 0;
  return static_cast<std::uint32_t>(1 + spare / std::max<std::uint64_t>(servers, 1));
}

}  // namespace pstrain
