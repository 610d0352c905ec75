// Role, index and hosts from a scheduler's environment (shared/scheduler_env.h):
// Slurm's hostlist and tasks-per-node syntax, each source with good, bad and
// inconsistent values, and the cluster file's `ps: {count: N}` whose hosts
// they fill.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "shared/config.h"
#include "shared/scheduler_env.h"

namespace pstrain {
namespace {

using Strings = std::vector<std::string>;

Strings hosts_of(const std::vector<Address>& list) {
  Strings out;
  for (const auto& a : list) out.push_back(a.host);
  return out;
}

// The error placement_from_environment raises, or "" when it raises none.
std::string error_of(const Environment& env, std::uint32_t ps = 2, std::uint32_t workers = 2) {
  try {
    placement_from_environment(env, ps, workers, "demo");
  } catch (const SchedulerError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("scheduler_env: Slurm hostlists expand in order with their zero padding") {
  CHECK(expand_hostlist("node01") == Strings{"node01"});
  CHECK(expand_hostlist("a,b") == Strings{"a", "b"});
  CHECK(expand_hostlist("node[01-03,07],gpu-a[1-2]") ==
        Strings{"node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"});
  CHECK(expand_hostlist("n[08-11]") == Strings{"n08", "n09", "n10", "n11"});
  CHECK(expand_hostlist("n[098-100]") == Strings{"n098", "n099", "n100"});
  CHECK(expand_hostlist("n[9-10]") == Strings{"n9", "n10"});
  CHECK(expand_hostlist("r[1-2]n[1-2]") == Strings{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expand_hostlist("n[0]x") == Strings{"n0x"});
  for (const char* bad : {"", "a,,b", "n[1-3", "n1-3]", "n[]", "n[3-1]", "n[a-b]", "n[1-]"}) {
    INFO(bad);
    CHECK_THROWS_AS(expand_hostlist(bad), SchedulerError);
  }
}

TEST_CASE("scheduler_env: Slurm tasks per node expand their repeats") {
  CHECK(expand_tasks_per_node("4") == std::vector<std::uint32_t>{4});
  CHECK(expand_tasks_per_node("2(x3),1") == std::vector<std::uint32_t>{2, 2, 2, 1});
  for (const char* bad : {"", "2(x0)", "2(x3", "x", "2,", "2(y3)"}) {
    INFO(bad);
    CHECK_THROWS_AS(expand_tasks_per_node(bad), SchedulerError);
  }
}

Environment slurm(const std::string& procid) {
  return {{"SLURM_PROCID", procid},
          {"SLURM_NTASKS", "4"},
          {"SLURM_JOB_NODELIST", "node[01-02]"},
          {"SLURM_TASKS_PER_NODE", "3,1"}};
}

TEST_CASE("scheduler_env: Slurm: the first tasks serve, hosts by block distribution") {
  const auto p = placement_from_environment(slurm("1"), 2, 2, "demo");
  REQUIRE(p);
  CHECK(p->source == "slurm");
  CHECK(p->role == "ps");
  CHECK(p->index == 1);
  CHECK(hosts_of(p->ps) == Strings{"node01", "node01"});
  CHECK(hosts_of(p->workers) == Strings{"node01", "node02"});
  CHECK(!p->ps[0].port);

  const auto w = placement_from_environment(slurm("3"), 2, 2, "demo");
  CHECK(w->role == "worker");
  CHECK(w->index == 1);

  // The step's own lists win over the job's.
  auto env = slurm("3");
  env["SLURM_STEP_NODELIST"] = "gpu[7-8]";
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  env["SLURMD_NODENAME"] = "gpu8";
  const auto s = placement_from_environment(env, 2, 2, "demo");
  CHECK(hosts_of(s->ps) == Strings{"gpu7", "gpu7"});
  CHECK(hosts_of(s->workers) == Strings{"gpu8", "gpu8"});
}

TEST_CASE("scheduler_env: Slurm errors name the variable") {
  CHECK(error_of(slurm("1"), 2, 1) ==
        "SLURM_NTASKS is 4 but cluster.yaml asks for 2 ps + 1 workers");
  auto env = slurm("x");
  CHECK(error_of(env) == "SLURM_PROCID is 'x', not a task number");
  env = slurm("4");
  CHECK(error_of(env) == "SLURM_PROCID 4 is not below SLURM_NTASKS 4");
  env = slurm("0");
  env.erase("SLURM_NTASKS");
  CHECK(error_of(env) == "SLURM_NTASKS is not set (needed for a Slurm task)");
  env = slurm("0");
  env.erase("SLURM_JOB_NODELIST");
  CHECK(error_of(env) == "SLURM_JOB_NODELIST is not set (needed for a Slurm task)");
  env = slurm("0");
  env["SLURM_JOB_NODELIST"] = "node[01-02";
  CHECK(error_of(env).starts_with("SLURM_JOB_NODELIST: hostlist 'node[01-02': unbalanced '['"));
  env = slurm("0");
  env["SLURM_JOB_NODELIST"] = "node[01-03]";
  CHECK(error_of(env) ==
        "SLURM_JOB_NODELIST names 3 nodes but SLURM_TASKS_PER_NODE gives counts for 2");
  env = slurm("0");
  env["SLURM_TASKS_PER_NODE"] = "2,1";
  CHECK(error_of(env) == "SLURM_TASKS_PER_NODE adds up to 3 tasks but SLURM_NTASKS is 4");
  env = slurm("3");
  env["SLURMD_NODENAME"] = "node01";
  CHECK(error_of(env).starts_with(
      "SLURMD_NODENAME is node01 but block distribution puts task 3 on node02"));
}

const std::string kTfCluster =
    R"("cluster": {"ps": ["ps0.svc:2222", "ps1.svc:2223"], "worker": ["w0:2222", "w1:2222"]})";

Environment tf(const std::string& task) {
  return {{"TF_CONFIG", "{" + kTfCluster + ", \"task\": " + task + "}"}};
}

TEST_CASE("scheduler_env: TF_CONFIG gives role, index, hosts and ports, and comes first") {
  auto env = tf(R"({"type": "worker", "index": 1})");
  env["SLURM_PROCID"] = "0";  // TF_CONFIG is asked first
  const auto p = placement_from_environment(env, 2, 2, "demo");
  REQUIRE(p);
  CHECK(p->source == "TF_CONFIG");
  CHECK(p->role == "worker");
  CHECK(p->index == 1);
  CHECK(hosts_of(p->ps) == Strings{"ps0.svc", "ps1.svc"});
  CHECK(p->ps[1].port == 2223);
  CHECK(hosts_of(p->workers) == Strings{"w0", "w1"});
  const auto ps = placement_from_environment(tf(R"({"type": "ps", "index": 0})"), 2, 2, "demo");
  CHECK(ps->role == "ps");
  const auto v6 = placement_from_environment(
      {{"TF_CONFIG", R"({"cluster": {"ps": ["[::1]:7000"], "worker": ["[::1]:7001"]},
                         "task": {"type": "ps", "index": 0}})"}},
      1, 1, "demo");
  CHECK(v6->ps[0].host == "::1");
}

TEST_CASE("scheduler_env: TF_CONFIG errors name the key") {
  CHECK(error_of(tf(R"({"type": "worker", "index": 4})")) ==
        "TF_CONFIG: task.index 4 but cluster.worker has 2 entries");
  CHECK(error_of(tf(R"({"type": "chief", "index": 0})")) ==
        "TF_CONFIG: task.type: expected \"ps\" or \"worker\", got \"chief\"");
  CHECK(error_of(tf(R"({"type": "ps", "index": -1})")) ==
        "TF_CONFIG: task.index: expected a non-negative integer");
  CHECK(error_of(tf(R"({"type": "ps", "index": 0})"), 3, 2) ==
        "TF_CONFIG: cluster.ps has 2 entries but cluster.yaml asks for 3");
  CHECK(error_of({{"TF_CONFIG", "{not json"}}).starts_with("TF_CONFIG is not valid JSON"));
  CHECK(error_of(
            {{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"}},
            1, 1) == "TF_CONFIG: cluster.worker is missing or not a list of \"host:port\"");
  CHECK(error_of({{"TF_CONFIG", R"({"cluster": {"ps": ["a"], "worker": ["b:1"]},
                                    "task": {"type": "ps", "index": 0}})"}},
                 1, 1) == "TF_CONFIG: cluster.ps[0]: expected \"host:port\", got \"a\"");
  CHECK(error_of({{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"], "chief": ["c:1"]},
                                    "task": {"type": "ps", "index": 0}})"}},
                 1, 1) == "TF_CONFIG: cluster.chief: pstrain has only ps and worker replicas");
}

TEST_CASE("scheduler_env: Kubernetes: the StatefulSet ordinal and headless Service names") {
  const Environment env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"HOSTNAME", "demo-worker-1"}};
  const auto p = placement_from_environment(env, 2, 2, "demo");
  REQUIRE(p);
  CHECK(p->source == "kubernetes");
  CHECK(p->role == "worker");
  CHECK(p->index == 1);
  CHECK(hosts_of(p->ps) == Strings{"demo-ps-0.demo-ps", "demo-ps-1.demo-ps"});
  CHECK(hosts_of(p->workers) == Strings{"demo-worker-0.demo-worker", "demo-worker-1.demo-worker"});
  // A job whose own name holds a role's word.
  const auto ps = placement_from_environment(
      {{"KUBERNETES_SERVICE_HOST", "x"}, {"HOSTNAME", "a-worker-ps-0"}}, 2, 2, "a-worker");
  CHECK(ps->role == "ps");
  CHECK(ps->ps[1].host == "a-worker-ps-1.a-worker-ps");

  CHECK(error_of({{"KUBERNETES_SERVICE_HOST", "x"}, {"HOSTNAME", "web-0"}}) ==
        "HOSTNAME is 'web-0' but a pod of job 'demo' is named demo-ps-N or demo-worker-N "
        "(a StatefulSet member)");
  CHECK(error_of({{"KUBERNETES_SERVICE_HOST", "x"}, {"HOSTNAME", "demo-ps-2"}}) ==
        "HOSTNAME is 'demo-ps-2' but cluster.yaml asks for 2 ps (ordinals 0..2-1)");
  CHECK(error_of({{"KUBERNETES_SERVICE_HOST", "x"}}) ==
        "HOSTNAME is not set (needed for a Kubernetes pod)");
}

TEST_CASE("scheduler_env: no scheduler, no placement") {
  CHECK(!placement_from_environment({{"HOME", "/root"}, {"TF_CONFIG", ""}}, 2, 2, "demo"));
}

TEST_CASE("scheduler_env: ps: {count} is pending until filled, and the hash is over the hosts") {
  const std::string file = "job: demo\nps: {count: 2, port_base: 9000}\nworkers: {count: 2}\n";
  auto c = parse_config(file);
  CHECK(c.hosts_pending);
  CHECK(c.ps[1].port == 9001);
  CHECK(c.to_yaml().find("ps: {count: 2, port_base: 9000, bind: 0.0.0.0}") != std::string::npos);
  // The pending form reads back as itself.
  CHECK(parse_config(c.to_yaml()).to_yaml() == c.to_yaml());

  const auto p = placement_from_environment(slurm("2"), 2, 2, "demo");
  auto a = c, b = c;
  const auto fill = [&](ClusterConfig& x, const Strings& ps_hosts, const Strings& worker_hosts) {
    x.fill_hosts(ps_hosts, {std::nullopt, 7200}, worker_hosts);
  };
  fill(a, hosts_of(p->ps), hosts_of(p->workers));
  fill(b, hosts_of(p->ps), hosts_of(p->workers));
  CHECK(!a.hosts_pending);
  CHECK(a.ps[0].host == "node01");
  CHECK(a.ps[0].port == 9000);
  CHECK(a.ps[1].port == 7200);
  CHECK(a.ps[1].bind_address() == "tcp://0.0.0.0:7200");
  CHECK(a.workers[1].host == "node02");
  CHECK(a.hash() == b.hash());
  CHECK(a.hash() != c.hash());
  auto other = c;
  fill(other, {"node01", "node09"}, hosts_of(p->workers));
  CHECK(other.hash() != a.hash());
  CHECK_THROWS_AS(a.fill_hosts({}, {}, {}), ConfigError);  // nothing pending

  CHECK_THROWS_WITH_AS(parse_config("ps: {count: 2}\nworkers: {count: 1, host: h}\n"),
                       "<string>: workers.0.host: leave it out: ps: {count} takes every host "
                       "from the scheduler",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_config("ps: {count: 2}\nworkers: auto\n"),
                       "<string>: workers: auto is resolved only by tools/launch; with ps: "
                       "{count} give workers: {count: N}",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_config("ps: {count: 2, port_base: 65535}\nworkers: {count: 1}\n"),
                       "<string>: ps.port_base: port_base + count - 1 must be at most 65535",
                       ConfigError);
  // Without ps: {count}, a worker's host is still 127.0.0.1 when left out.
  CHECK(parse_config("ps: [{host: h, port: 1}]\nworkers: {count: 1}\n").workers[0].host ==
        "127.0.0.1");
}

}  // namespace
}  // namespace pstrain
