// The `pstrain` binary: one process of a run, its role chosen by flag.
//
// Exit codes: 0 done; 1 the role failed at run time; 2 bad command line or
// configuration (nothing was started). A role's own non-zero code passes
// through.

#include <boost/program_options.hpp>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/build_info.h"
#include "app/plan.h"
#include "client/data/synthetic_ctr.h"
#include "client/model/model_io.h"
#include "client/train/worker_role.h"
#include "server/ps_role.h"
#include "server/request_loop.h"
#include "shared/atomic_file.h"
#include "shared/config.h"
#include "shared/curve_keys.h"
#include "shared/error.h"
#include "shared/log.h"
#include "shared/metrics_server.h"
#include "shared/protocol.h"
#include "shared/scheduler_env.h"
#include "shared/throughput_model.h"
#include "shared/trace.h"

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "pstrain: data-parallel training with parameter servers.\n"
    "\n"
    "Usage:\n"
    "  pstrain --role ps     --index N [options]    serve parameter server N of the cluster\n"
    "  pstrain --role worker --index N [options]    train as worker N\n"
    "  pstrain [options]                            ps or worker as the scheduler says\n"
    "  pstrain --role eval   --model FILE [options] print the test accuracy of a saved model\n"
    "  pstrain --keygen DIR  [options]              write the cluster's CURVE keys into DIR\n"
    "  pstrain --export-data DIR [options]          write synthetic-ctr's splits as Criteo TSV\n"
    "\n"
    "Every process of a run must be given the same cluster file and --set overrides\n"
    "(their hash is checked when a worker connects) and the same --run-id.\n"
    "tools/launch starts a whole cluster from one file, with a new run id.\n"
    "\n"
    "Without --role, the role and index come from the scheduler's environment:\n"
    "TF_CONFIG, else Slurm (SLURM_PROCID), else Kubernetes (KUBERNETES_SERVICE_HOST);\n"
    "a cluster file with ps: {count: N} takes its hosts from there (docs/clusters.md).\n"
    "\n"
    "With security.curve, each process reads its secret key and the public list from\n"
    "$PSTRAIN_KEYS, else from security.keys (docs/security.md).\n"
    "\n";

constexpr const char* kNoRole =
    "--role is required (ps, worker or eval; see --help) where no scheduler's environment "
    "gives it (TF_CONFIG, SLURM_PROCID and KUBERNETES_SERVICE_HOST are unset)";

// A bad command line: reported with exit code 2 before anything starts.
struct UsageError : pstrain::Error {
  using pstrain::Error::Error;
};

struct Args {
  bool check = false;
  std::optional<std::filesystem::path> keygen;
  std::optional<std::filesystem::path> export_data;
  std::optional<pstrain::PlanRequest> plan;
  std::string role;  // empty: from the scheduler's environment
  std::uint32_t index = 0;
  std::filesystem::path cluster;
  std::vector<std::string> overrides;
  std::optional<std::filesystem::path> restore;
  std::optional<std::filesystem::path> model;
  std::uint64_t run_nonce = 0;  // --run-id; 0: none
  std::optional<std::filesystem::path> trace;
};

po::options_description options() {
  po::options_description desc("Options");
  desc.add_options()("role", po::value<std::string>()->value_name("ps|worker|eval"),
                     "the role of this process")(
      "index", po::value<std::string>()->value_name("N"),
      "which ps or worker of the cluster this is (0-based; required for ps and worker)")(
      "cluster", po::value<std::string>()->default_value("cluster.yaml")->value_name("FILE"),
      "the cluster file")(
      "set", po::value<std::vector<std::string>>()->composing()->value_name("KEY=VALUE"),
      "override a cluster file value, e.g. --set optimizer.lr=0.05 --set workers.0.device=cuda "
      "(repeatable; values are YAML)")(
      "mode", po::value<std::string>()->value_name("async|sync|ssp|backup|local"),
      "shorthand for --set mode=..., applied after every --set")(
      "restore", po::value<std::string>()->value_name("DIR|latest"),
      "ps: start from saved values instead of fresh ones: latest: this ps's newest readable "
      "checkpoint in run_dir/checkpoints (fresh values when there is none); DIR: the "
      "ps<N>.bin in DIR (run_dir/snapshot, or one checkpoints/ckpt-<seq>). With the role "
      "from the scheduler it applies to the servers and workers ignore it, so one command "
      "serves every task")(
      "run-id", po::value<std::string>()->value_name("HEX"),
      "ps and worker: this launch's nonce (1 to 16 hex digits, not 0), the same for every "
      "process of the launch; tools/launch draws a new one per launch. Without it the run id "
      "is the config hash alone, and a stale process of an earlier run of the same config is "
      "accepted")(
      "trace", po::value<std::string>()->value_name("FILE"),
      "ps and worker: write a timeline of this process's work to FILE as Chrome trace-event "
      "JSON (chrome://tracing, ui.perfetto.dev): a worker's steps (train.trace_steps of them, "
      "after the first train.trace_skip) with forward and backward per layer, each send, the "
      "wait and the copies; a ps's requests, time queued and optimizer apply")(
      "model", po::value<std::string>()->value_name("FILE"), "eval: the saved model to test")(
      "check",
      "validate the cluster file and overrides, print the resolved config, and exit "
      "(no --role needed; tools/launch runs this before starting anything)")(
      "keygen", po::value<std::string>()->value_name("DIR"),
      "write a CURVE key pair for every ps and worker of the cluster and for the tool "
      "identity into DIR (secret files ps-N.key, worker-N.key, tool.key, mode 0600), and the "
      "list of public keys (DIR/public_keys), then exit (no --role needed)")(
      "export-data", po::value<std::string>()->value_name("DIR"),
      "write the configured synthetic-ctr data set's training and test splits as "
      "DIR/train.tsv and DIR/test.tsv in Criteo's format (for a peer to train on the same "
      "samples), then exit (no --role needed)")(
      "plan", po::value<std::string>()->value_name("RATE"),
      "predict the cluster's samples/s on hosts joined by links of RATE each way (tc style: "
      "100mbit, 1gbit, 10gbit) for 1, 2, 4 and 8 ps and the wire formats fp32 and bf16, name "
      "the fewest ps within 10% of the best (docs/scaling.md), then exit; needs --step-ms")(
      "step-ms", po::value<double>()->value_name("MS"),
      "--plan: a worker's forward and backward per step in ms (compute_ms of a worker's "
      "metrics, or bench_step's)")(
      "apply-gbps", po::value<double>()->value_name("GB/S"),
      "--plan: float32 gradient one ps applies per second, in GB/s (default 4)")(
      "help,h", "print this help")("version", "print the version");
  return desc;
}

std::uint64_t parse_run_id(const std::string& text) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (ec != std::errc() || end != text.data() + text.size() || text.size() > 16 || value == 0)
    throw UsageError("--run-id: expected 1 to 16 hex digits, not all 0, got '" + text + "'");
  return value;
}

std::uint32_t parse_index(const std::string& text) {
  std::uint32_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw UsageError("--index: expected a non-negative integer, got '" + text + "'");
  }
  return value;
}

// Returns nullopt when --help or --version was answered.
std::optional<Args> parse_args(int argc, char** argv) {
  const auto desc = options();
  po::variables_map vm;
  // pstrain takes no positional arguments; they are collected only to name
  // the stray word in the error instead of silently ignoring it.
  po::options_description all;
  all.add(desc).add_options()("stray", po::value<std::vector<std::string>>());
  po::positional_options_description stray;
  stray.add("stray", -1);
  po::store(po::command_line_parser(argc, argv).options(all).positional(stray).run(), vm);
  po::notify(vm);
  if (vm.count("stray")) {
    throw UsageError("unexpected argument '" + vm["stray"].as<std::vector<std::string>>()[0] +
                     "' (options start with --; see --help)");
  }
  if (vm.count("help")) {
    std::cout << kUsage << desc;
    return std::nullopt;
  }
  if (vm.count("version")) {
    std::cout << "pstrain " << pstrain::build_version() << "\n" << pstrain::build_description();
    return std::nullopt;
  }

  Args args;
  args.check = vm.count("check") > 0;
  if (vm.count("export-data")) {
    if (args.check || vm.count("keygen") || vm.count("role"))
      throw UsageError("--export-data takes no --check, --keygen or --role");
    args.export_data = vm["export-data"].as<std::string>();
    args.role = "export";
  } else if (vm.count("keygen")) {
    if (args.check) throw UsageError("--keygen and --check do not go together");
    args.keygen = vm["keygen"].as<std::string>();
    args.role = "keygen";
  } else if (vm.count("plan")) {
    if (args.check || vm.count("role")) throw UsageError("--plan takes no --check or --role");
    if (!vm.count("step-ms"))
      throw UsageError("--plan needs --step-ms MS, a worker's compute per step");
    pstrain::PlanRequest plan;
    try {
      plan.link_bits_per_s = pstrain::parse_link_rate(vm["plan"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--plan: ") + e.what());
    }
    plan.step_ms = vm["step-ms"].as<double>();
    plan.apply_bytes_per_s = (vm.count("apply-gbps") ? vm["apply-gbps"].as<double>() : 4.0) * 1e9;
    if (!(plan.step_ms > 0) || !(plan.apply_bytes_per_s > 0))
      throw UsageError("--step-ms and --apply-gbps must be positive");
    args.plan = plan;
    args.role = "plan";
  } else if (args.check) {
    args.role = "check";
  } else if (vm.count("role")) {
    args.role = vm["role"].as<std::string>();
  } else if (!vm.count("index") && !pstrain::scheduler_source(pstrain::process_environment())) {
    throw UsageError(kNoRole);
  }
  if (args.keygen && vm.count("role")) throw UsageError("--keygen takes no --role");
  if (!args.plan && (vm.count("step-ms") || vm.count("apply-gbps")))
    throw UsageError("--step-ms and --apply-gbps apply only to --plan");
  if (!args.check && !args.keygen && !args.export_data && !args.plan && !args.role.empty() &&
      args.role != "ps" && args.role != "worker" && args.role != "eval") {
    throw UsageError("--role: expected ps, worker or eval, got '" + args.role + "'");
  }
  const bool from_scheduler = args.role.empty();
  const bool indexed = args.role == "ps" || args.role == "worker" || from_scheduler;
  if (vm.count("index")) {
    if (from_scheduler)
      throw UsageError(
          "--index needs --role (without both, the scheduler's environment gives "
          "them)");
    if (!indexed)
      throw UsageError("--index does not apply to --" +
                       (args.export_data ? std::string("export-data") : args.role));
    args.index = parse_index(vm["index"].as<std::string>());
  } else if (indexed && !from_scheduler) {
    throw UsageError("--index is required for --role " + args.role);
  }
  args.cluster = vm["cluster"].as<std::string>();
  if (vm.count("set")) args.overrides = vm["set"].as<std::vector<std::string>>();
  if (vm.count("mode")) {
    const auto mode = vm["mode"].as<std::string>();
    if (mode != "async" && mode != "sync" && mode != "ssp" && mode != "backup" && mode != "local") {
      throw UsageError("--mode: expected async, sync, ssp, backup or local, got '" + mode + "'");
    }
    args.overrides.push_back("mode=" + mode);
  }
  if (vm.count("restore")) {
    if (args.role != "ps" && !from_scheduler)
      throw UsageError("--restore applies only to --role ps");
    args.restore = vm["restore"].as<std::string>();
  }
  if (vm.count("run-id")) {
    if (!indexed) throw UsageError("--run-id applies only to --role ps and worker");
    args.run_nonce = parse_run_id(vm["run-id"].as<std::string>());
  }
  if (vm.count("trace")) {
    if (!indexed) throw UsageError("--trace applies only to --role ps and worker");
    args.trace = vm["trace"].as<std::string>();
  }
  if (vm.count("model")) {
    if (args.role != "eval") throw UsageError("--model applies only to --role eval");
    args.model = vm["model"].as<std::string>();
  } else if (args.role == "eval") {
    throw UsageError("--role eval needs --model FILE");
  }
  return args;
}

// The scheduler's placement where this process needs one: its role was not
// given, or the file leaves the hosts to the scheduler. Fills args' role and
// index and the config's pending hosts; nullopt when none was needed.
std::optional<pstrain::Placement> place(Args& args, pstrain::ClusterConfig& config) {
  const bool role_needed = args.role.empty() && !args.check;
  if (!role_needed && !config.hosts_pending) return std::nullopt;
  const std::string where = args.cluster.string();
  if (config.workers_auto)
    throw UsageError(where +
                     ": workers: auto is resolved only by tools/launch; under a "
                     "scheduler give workers: {count: N}");
  const auto placement = pstrain::placement_from_environment(
      pstrain::process_environment(), static_cast<std::uint32_t>(config.ps.size()),
      static_cast<std::uint32_t>(config.workers.size()), config.job);
  if (!placement) {
    // Without --role, parse_args has found a scheduler: only pending hosts get here.
    if (args.check) return std::nullopt;  // --check shows the file as it is
    throw UsageError(where +
                     ": ps: {count} leaves the hosts to a scheduler, and no scheduler's "
                     "environment was found (TF_CONFIG, SLURM_PROCID and "
                     "KUBERNETES_SERVICE_HOST are unset)");
  }
  if (role_needed) {
    args.role = placement->role;
    args.index = placement->index;
  }
  if (config.hosts_pending) {
    std::vector<std::string> ps_hosts, worker_hosts;
    std::vector<std::optional<std::uint16_t>> ps_ports;
    for (const auto& a : placement->ps) {
      ps_hosts.push_back(a.host);
      ps_ports.push_back(a.port);
    }
    for (const auto& a : placement->workers) worker_hosts.push_back(a.host);
    config.fill_hosts(ps_hosts, ps_ports, worker_hosts);
  }
  return placement;
}

// What --check and the log say about a placement, one line each.
std::vector<std::string> describe(const pstrain::Placement& p, const pstrain::ClusterConfig& c) {
  std::vector<std::string> lines = {"from " + p.source + ": " + p.role + " " +
                                    std::to_string(p.index)};
  std::string ps = "ps:", workers = "workers:";
  for (const auto& e : c.ps) ps += " " + e.host + ":" + std::to_string(e.port);
  for (const auto& w : c.workers) workers += " " + w.host;
  lines.push_back(ps);
  lines.push_back(workers);
  return lines;
}

void check_index(const Args& args, const pstrain::ClusterConfig& config) {
  const std::string where = args.cluster.string();
  if (args.role == "ps" && args.index >= config.ps.size()) {
    throw UsageError("--index " + std::to_string(args.index) + ": " + where + " lists " +
                     std::to_string(config.ps.size()) + " parameter servers (indices 0.." +
                     std::to_string(config.ps.size() - 1) + ")");
  }
  if (args.role == "worker") {
    if (config.workers_auto) {
      throw UsageError(where +
                       ": workers: auto is resolved only by tools/launch; to start a worker by "
                       "hand, list the workers or give {count: N}");
    }
    if (args.index >= config.workers.size()) {
      throw UsageError("--index " + std::to_string(args.index) + ": " + where + " lists " +
                       std::to_string(config.workers.size()) + " workers (indices 0.." +
                       std::to_string(config.workers.size() - 1) + ")");
    }
  }
}

// Records the resolved configuration beside the run's outputs. ps 0 and
// worker 0 may both write it at once; each writes its own temporary file and
// renames it into place, so a reader never sees a torn file.
void write_resolved_config(const pstrain::ClusterConfig& config) {
  pstrain::write_file_atomically(config.run_dir / "config.yaml", config.to_yaml());
}

// Writes the cluster's keys (shared/curve_keys.h); 2 when it cannot.
int keygen(const std::filesystem::path& dir, const std::filesystem::path& cluster,
           const pstrain::ClusterConfig& config) {
  if (config.workers_auto)
    throw UsageError(cluster.string() + ": workers: auto is resolved only by tools/launch; " +
                     "to make keys by hand, list the workers or give {count: N}");
  try {
    pstrain::write_cluster_keys(dir, static_cast<std::uint32_t>(config.ps.size()),
                                static_cast<std::uint32_t>(config.workers.size()));
  } catch (const pstrain::CurveKeyError& e) {
    std::cerr << "pstrain: keygen: " << e.what() << "\n";
    return 2;
  }
  std::cout << "pstrain: keys for " << config.ps.size() << " ps, " << config.workers.size()
            << " workers and the tool in " << dir.string() << "\n";
  return 0;
}

int run(const Args& args, const pstrain::ClusterConfig& config,
        const std::optional<pstrain::Placement>& placement) {
  // Every log starts with the version: a run's logs say which build made them.
  if (args.role == "eval") {
    pstrain::log_open("eval", {});
    pstrain::log("pstrain ", pstrain::build_version());
    return pstrain::run_eval_role(config, *args.model);
  }
  const std::string name = args.role + std::to_string(args.index);
  pstrain::log_open(name, config.run_dir / (name + ".log"));
  pstrain::log("pstrain ", pstrain::build_version());
  if (placement)
    for (const auto& line : describe(*placement, config)) pstrain::log("placed " + line);
  if (args.index == 0) write_resolved_config(config);
  if (config.launch_nonce == 0)
    pstrain::log(
        "no --run-id: the run id is the config hash alone, so a stale process of an "
        "earlier run of this config is accepted (tools/launch gives every launch its own)");
  // Written when the role returns or throws (a failed run's timeline is
  // the one most worth reading).
  std::optional<pstrain::TraceSession> trace;
  if (args.trace) trace.emplace(*args.trace, args.role + " " + std::to_string(args.index));
  if (args.role == "ps") {
    const int code = pstrain::run_ps_role(config, args.index, args.restore);
    // A Slurm step restarts all its tasks or none (tools/launch --emit slurm
    // ends it when one task fails): there a ps fenced by its backup ends its
    // task with 0, the backup serving its shard, rather than restart the
    // whole cluster. tools/launch and Kubernetes restart the one process,
    // which re-joins.
    if (code == pstrain::ps::kExitFenced && placement && placement->source == "slurm") return 0;
    return code;
  }
  return pstrain::run_worker_role(config, args.index);
}

}  // namespace

int main(int argc, char** argv) {
  // Gloo writes to its peers with writev, which cannot ask for MSG_NOSIGNAL:
  // a sync peer killed mid-step would take this process down with SIGPIPE
  // instead of letting the all-reduce fail and the step restart. A closed
  // connection is an error return (EPIPE) everywhere we handle it.
  std::signal(SIGPIPE, SIG_IGN);
  Args args;
  pstrain::ClusterConfig config;
  std::optional<pstrain::Placement> placement;
  try {
    auto parsed = parse_args(argc, argv);
    if (!parsed) return 0;
    args = std::move(*parsed);
    // A saved model carries the config of the run that trained it; eval
    // tests it with that model and data (and the command line's --set).
    config = args.role == "eval" ? pstrain::load_model_config(*args.model, args.overrides)
                                 : pstrain::load_config(args.cluster, args.overrides);
    if (args.keygen) return keygen(*args.keygen, args.cluster, config);
    if (args.export_data) {
      const auto [train, test] = pstrain::export_ctr_data(config.data, *args.export_data);
      std::cout << "pstrain: " << config.data.name << " written to " << train.string() << " and "
                << test.string() << "\n";
      return 0;
    }
    if (args.plan) {
      std::cout << pstrain::plan_report(config, *args.plan);
      return 0;
    }
    if (args.role != "eval") placement = place(args, config);
    if (args.check) {
      pstrain::check_model(config);
      // As YAML comments, so that the output still reads as the config.
      if (placement)
        for (const auto& line : describe(*placement, config)) std::cout << "# " << line << "\n";
      else if (config.hosts_pending)
        std::cout << "# hosts: left to the scheduler (none found in the environment)\n";
      std::cout << config.to_yaml();
      return 0;
    }
    check_index(args, config);
    config.launch_nonce = args.run_nonce;
  } catch (const po::error& e) {
    std::cerr << "pstrain: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const std::exception& e) {  // UsageError, ConfigError
    std::cerr << "pstrain: " << e.what() << "\n";
    return 2;
  }

  const std::string who =
      args.role == "eval" ? args.role : args.role + " " + std::to_string(args.index);
  try {
    return run(args, config, placement);
  } catch (const pstrain::MetricsServerError& e) {
    // Like a ps's port taken: nothing was started.
    pstrain::log_plain("pstrain: " + who + ": " + e.what());
    return 2;
  } catch (const std::exception& e) {
    pstrain::log_plain("pstrain: " + who + ": " + e.what());
    return 1;
  }
}
