// The `pstrain` command line: help, exit codes and messages for bad input,
// and the resolved config.yaml a run records.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <algorithm>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "shared/config.h"
#include "tests/support/child_process.h"
#include "tests/support/pstrain_binary.h"

namespace pstrain {
namespace {

using namespace std::chrono_literals;

struct Result {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs pstrain to completion; these invocations never start a role, or fail
// before it starts, so they end at once. The scheduler variables the test
// itself may run under are blanked (shared/scheduler_env.h reads an empty
// one as unset); `env` adds others.
Result run_cli(const TempDir& dir, std::vector<std::string> args,
               std::vector<std::string> env = {}) {
  static int runs = 0;
  const auto log = dir.path() / ("cli-" + std::to_string(runs++) + ".log");
  args.insert(args.begin(), pstrain::testing::pstrain_binary());
  for (const char* blank : {"TF_CONFIG=", "SLURM_PROCID=", "KUBERNETES_SERVICE_HOST="}) {
    const std::string name = std::string(blank).substr(0, std::string(blank).size() - 1);
    const bool given = std::any_of(env.begin(), env.end(),
                                   [&](const std::string& e) { return e.starts_with(name + "="); });
    if (!given) env.push_back(blank);
  }
  ChildProcess child(args, log, env);
  const auto code = child.wait_for(20s);
  REQUIRE_MESSAGE(code.has_value(), "pstrain did not exit: " << child.log_text());
  return {*code, child.log_text()};
}

std::string cluster_file(const TempDir& dir) {
  const auto path = dir.path() / "cluster.yaml";
  std::ofstream(path) << "job: cli\n"
                         "ps: [{host: 127.0.0.1, port: "
                      << free_port()
                      << "}]\n"
                         "workers: {count: 2}\n"
                         "data: {name: synthetic}\n";
  return path.string();
}

}  // namespace

TEST_CASE("cli: --help lists the roles, --version answers") {
  TempDir dir;
  const auto help = run_cli(dir, {"--help"});
  CHECK(help.code == 0);
  for (const char* text : {"--role ps", "--role worker", "--role eval", "--cluster", "--set"}) {
    INFO(text);
    CHECK(help.output.find(text) != std::string::npos);
  }
  // The version (x.y.z, the commit after it in a checkout), then what the
  // build holds.
  const auto version = run_cli(dir, {"--version"});
  CHECK(version.code == 0);
  CHECK_MESSAGE(std::regex_search(version.output, std::regex("^pstrain [0-9]+\\.[0-9]+\\.[0-9]+")),
                version.output);
  for (const char* line : {"\nwire protocol ", "\nbuild: ", "\nCUDA: ", "\ncuDNN: ", "\nCURVE: "}) {
    INFO(std::string(line) << " in " << version.output);
    CHECK(version.output.find(line) != std::string::npos);
  }
}

#ifdef PSTRAIN_FAKE_CUDNN_OTHER_CUDA
TEST_CASE("cli: --version says whether GPU convolutions can use cuDNN, and why not") {
  TempDir dir;
  const auto line = [&](std::vector<std::string> env) {
    env.push_back(std::string("PSTRAIN_CUDA_LIB=") + PSTRAIN_CUDA_LIBRARY);
    const auto version = run_cli(dir, {"--version"}, env);
    REQUIRE(version.code == 0);
    const auto at = version.output.find("\ncuDNN: ");
    REQUIRE_MESSAGE(at != std::string::npos, version.output);
    return version.output.substr(at + 1, version.output.find('\n', at + 1) - at - 1);
  };
  // The toolkit's own cuDNN, where the build found its headers, serves.
  if (std::filesystem::exists("/usr/local/cuda/include/cudnn.h")) {
    CHECK_MESSAGE(std::regex_search(line({}), std::regex("^cuDNN: 9\\.[0-9]+\\.[0-9]+ for CUDA "
                                                         "[0-9]+\\.[0-9]+ from .*libcudnn")),
                  line({}));
  }
  const std::string other =
      line({std::string("PSTRAIN_CUDNN_LIB=") + PSTRAIN_FAKE_CUDNN_OTHER_CUDA});
  CHECK_MESSAGE(other.starts_with("cuDNN: not usable ("), other);
  CHECK_MESSAGE(std::regex_search(other, std::regex("was built for CUDA [0-9]+\\.8, this library "
                                                    "for CUDA [0-9]+\\.[0-9]+\\): GPU "
                                                    "convolutions take the im2col path$")),
                other);
  const std::string broken = line({std::string("PSTRAIN_CUDNN_LIB=") + PSTRAIN_FAKE_CUDNN_BROKEN});
  CHECK_MESSAGE(broken.find("has no cudnnGetErrorString") != std::string::npos, broken);
  CHECK(line({"PSTRAIN_CUDNN_LIB=off"}) ==
        "cuDNN: not usable (PSTRAIN_CUDNN_LIB=off): GPU convolutions take the im2col path");
}
#endif

TEST_CASE("cli: bad command lines exit 2 naming the problem") {
  TempDir dir;
  const std::string cluster = cluster_file(dir);
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{},
       "pstrain: --role is required (ps, worker or eval; see --help) where no scheduler's "
       "environment gives it (TF_CONFIG, SLURM_PROCID and KUBERNETES_SERVICE_HOST are unset)"},
      {{"--index", "0", "--cluster", cluster}, "pstrain: --index needs --role"},
      {{"--role", "boss", "--cluster", cluster},
       "pstrain: --role: expected ps, worker or eval, got 'boss'"},
      {{"--role", "ps", "--cluster", cluster}, "pstrain: --index is required for --role ps"},
      {{"--role", "worker", "--index", "x", "--cluster", cluster},
       "pstrain: --index: expected a non-negative integer, got 'x'"},
      {{"--role", "ps", "--index", "1", "--cluster", cluster},
       "pstrain: --index 1: " + cluster + " lists 1 parameter servers (indices 0..0)"},
      {{"--role", "worker", "--index", "2", "--cluster", cluster},
       "pstrain: --index 2: " + cluster + " lists 2 workers (indices 0..1)"},
      {{"--role", "worker", "--index", "0", "--cluster", cluster, "--set", "workers=auto"},
       "pstrain: " + cluster + ": workers: auto is resolved only by tools/launch"},
      {{"--role", "worker", "--index", "0", "--cluster", cluster, "--set", "train.batchsize=3"},
       "pstrain: " + cluster + ": train.batchsize: unknown key"},
      {{"--role", "worker", "--index", "0", "--cluster", cluster, "--set", "foo"},
       "pstrain: --set 'foo': expected key=value"},
      {{"--role", "worker", "--index", "0", "--cluster", cluster, "--mode", "lazy"},
       "pstrain: --mode: expected async, sync, ssp, backup or local, got 'lazy'"},
      {{"--role", "ps", "--index", "0", "--cluster", (dir.path() / "none.yaml").string()},
       "pstrain: " + (dir.path() / "none.yaml").string() + ": no such file"},
      {{"--role", "worker", "--index", "0", "--cluster", cluster, "--restore", "x"},
       "pstrain: --restore applies only to --role ps"},
      {{"--role", "eval", "--cluster", cluster}, "pstrain: --role eval needs --model FILE"},
      {{"--role", "worker", "--index", "0", "--cluster", cluster, "extra"},
       "pstrain: unexpected argument 'extra'"},
      {{"--role", "worker", "--index", "0", "--cluster", cluster, "--bogus"},
       "pstrain: unrecognised option '--bogus'"},
      // --check builds the model: a layer list's shape errors are named.
      {{"--check", "--cluster", cluster, "--set",
        "model=[{type: dense, units: 9, name: a}, {type: dot_interaction, inputs: [a, input]}, "
        "{type: dense, units: 10}]"},
       "pstrain: model: layer 1 (dot_interaction): input 'input' has 784 floats per sample, not "
       "a whole number of vectors of the first input's width 9"},
      {{"--check", "--cluster", cluster, "--set", "model=dlrm"},
       "pstrain: model.loss: bce needs a data set of 2 classes (click or not), got 10"},
      {{"--export-data", (dir.path() / "out").string(), "--index", "0", "--cluster", cluster},
       "pstrain: --index does not apply to --export-data"},
      {{"--export-data", (dir.path() / "out").string(), "--cluster", cluster},
       "pstrain: --export-data writes synthetic-ctr's samples; data.name is synthetic"},
      {{"--plan", "1gbit", "--cluster", cluster},
       "pstrain: --plan needs --step-ms MS, a worker's compute per step"},
      {{"--plan", "fast", "--step-ms", "1", "--cluster", cluster},
       "pstrain: --plan: 'fast' is not a rate"},
      {{"--plan", "1gbit", "--step-ms", "0", "--cluster", cluster},
       "pstrain: --step-ms and --apply-gbps must be positive"},
      {{"--role", "ps", "--index", "0", "--step-ms", "1", "--cluster", cluster},
       "pstrain: --step-ms and --apply-gbps apply only to --plan"},
      {{"--plan", "1gbit", "--step-ms", "1", "--cluster", cluster, "--mode", "local"},
       "pstrain: --plan: mode local is not modelled"},
  };
  for (const auto& c : cases) {
    INFO(c.expected);
    const auto result = run_cli(dir, c.args);
    CHECK(result.code == 2);
    CHECK(result.output.rfind(c.expected, 0) == 0);
  }
}

TEST_CASE("cli: --plan predicts every ps count and wire format and names the fewest ps") {
  TempDir dir;
  // The MLP (235,146 parameters), 8 workers on 100 Mbit links, a 100 ms
  // step: one ps's link carries 8 x 0.94 MB each way per round (0.63 s),
  // so more ps help until a worker's compute and own link bind (0.18 s:
  // most of its pushes leave during its 67 ms backward).
  const auto result = run_cli(dir, {"--plan", "100mbit", "--step-ms", "100", "--cluster",
                                    cluster_file(dir), "--set", "workers={count: 8}"});
  REQUIRE_MESSAGE(result.code == 0, result.output);
  INFO(result.output);
  CHECK(result.output.find("model mlp (235,146 parameters") != std::string::npos);
  CHECK(result.output.find("| 1 (this file) | ") != std::string::npos);
  CHECK(result.output.find("ps link") != std::string::npos);
  CHECK(result.output.find("worker: compute and its link") != std::string::npos);
  // The busiest of 4 ps still holds one of the MLP's 256 KiB chunks and
  // more (0.22 s a round); 8 ps hold at most one chunk each, as fast as the
  // workers' own bound: 8 is the fewest within 10%.
  const std::regex fewest(R"(wire fp32: (\d) ps \()");
  std::smatch m;
  REQUIRE(std::regex_search(result.output, m, fewest));
  CHECK(m[1] == "8");
  CHECK(result.output.find("wire bf16: ") != std::string::npos);
}

TEST_CASE("cli: --export-data writes synthetic-ctr's splits in Criteo's format") {
  TempDir dir;
  const auto out = dir.path() / "ctr";
  const auto result =
      run_cli(dir, {"--export-data", out.string(), "--cluster", cluster_file(dir), "--set",
                    "data={name: synthetic-ctr, synthetic_train: 300, synthetic_test: 120}"});
  REQUIRE_MESSAGE(result.code == 0, result.output);
  for (const auto& [name, lines] : {std::pair{"train.tsv", 300}, std::pair{"test.tsv", 120}}) {
    std::ifstream in(out / name);
    int count = 0;
    for (std::string line; std::getline(in, line); ++count)
      CHECK(std::count(line.begin(), line.end(), '\t') == 39);
    CHECK(count == lines);
  }
}

TEST_CASE("cli: ps 0 records the resolved config in run_dir") {
  TempDir dir;
  const std::string cluster = cluster_file(dir);
  const auto run_dir = dir.path() / "run";
  const std::vector<std::string> overrides = {"run_dir=" + run_dir.string(), "train.seed=9",
                                              "mode=sync"};
  ChildProcess ps({pstrain::testing::pstrain_binary(), "--role", "ps", "--index", "0", "--cluster",
                   cluster, "--set", overrides[0], "--set", overrides[1], "--mode", "sync"},
                  dir.path() / "ps.log");
  const auto written = run_dir / "config.yaml";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!std::filesystem::exists(written) && std::chrono::steady_clock::now() < deadline &&
         !ps.wait_for(50ms)) {
  }
  REQUIRE_MESSAGE(std::filesystem::exists(written), ps.log_text());
  ps.stop();

  const auto recorded = load_config(written);
  const auto expected = load_config(cluster, overrides);
  CHECK(recorded.hash() == expected.hash());
  CHECK(recorded.mode == Mode::sync);
  CHECK(recorded.train.seed == 9);
  // Only the renamed file and the process's log are left: no torn or
  // temporary copies. The checkpoints folder is there only when SIGTERM came
  // after the ps had begun serving (it checkpoints on its way out then).
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir))
    if (entry.path().filename() != "checkpoints") names.push_back(entry.path().filename().string());
  std::ranges::sort(names);
  CHECK(names == std::vector<std::string>{"config.yaml", "ps0.log"});
}

TEST_CASE("cli: a failure after start exits 1 naming the role and index") {
  TempDir dir;
  const std::string cluster = cluster_file(dir);
  const auto blocker = dir.path() / "file";
  std::ofstream(blocker) << "not a directory";
  const auto result = run_cli(dir, {"--role", "ps", "--index", "0", "--cluster", cluster, "--set",
                                    "run_dir=" + (blocker / "run").string()});
  CHECK(result.code == 1);
  CHECK(result.output.rfind("pstrain: ps 0: ", 0) == 0);
}

TEST_CASE("cli: without --role, Slurm's variables place the process and --check shows where") {
  TempDir dir;
  const auto cluster = (dir.path() / "slurm.yaml").string();
  std::ofstream(cluster) << "job: cli\nps: {count: 2}\nworkers: {count: 2}\n"
                            "data: {name: synthetic}\n";
  const std::vector<std::string> slurm = {"SLURM_PROCID=3", "SLURM_NTASKS=4",
                                          "SLURM_JOB_NODELIST=node[08-09]",
                                          "SLURM_TASKS_PER_NODE=3,1"};
  const auto check = run_cli(dir, {"--check", "--cluster", cluster}, slurm);
  CHECK(check.code == 0);
  CHECK_MESSAGE(check.output.rfind("# from slurm: worker 1\n"
                                   "# ps: node08:7100 node08:7101\n"
                                   "# workers: node08 node09\n",
                                   0) == 0,
                check.output);
  CHECK_MESSAGE(check.output.find("  - {host: node09, device: cpu") != std::string::npos,
                check.output);

  // Without a scheduler the file is shown as given.
  const auto bare = run_cli(dir, {"--check", "--cluster", cluster});
  CHECK(bare.code == 0);
  CHECK(bare.output.rfind("# hosts: left to the scheduler", 0) == 0);
  CHECK(bare.output.find("ps: {count: 2, port_base: 7100, bind: 0.0.0.0}") != std::string::npos);

  auto three = slurm;
  three[1] = "SLURM_NTASKS=3";
  const auto bad = run_cli(dir, {"--cluster", cluster}, three);
  CHECK(bad.code == 2);
  CHECK(bad.output == "pstrain: SLURM_NTASKS is 3 but cluster.yaml asks for 2 ps + 2 workers\n");

  const auto unplaced = run_cli(dir, {"--role", "ps", "--index", "0", "--cluster", cluster});
  CHECK(unplaced.code == 2);
  CHECK(unplaced.output.rfind("pstrain: " + cluster +
                                  ": ps: {count} leaves the hosts to a "
                                  "scheduler, and no scheduler's environment was found",
                              0) == 0);
}

}  // namespace pstrain
