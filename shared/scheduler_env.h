#pragma once
// Which ps or worker this process is, and where every process runs, read
// from the environment a scheduler gives its tasks (docs/clusters.md).
//
// Pure functions over an environment map, so tests need no real scheduler.
// The sources, asked in this order; the first whose variable is set and not
// empty decides (an empty one reads as unset, so a test can blank it):
//   TF_CONFIG   a Kubeflow TFJob replica: JSON {"cluster": {"ps": ["h:p", ...],
//               "worker": [...]}, "task": {"type": "ps"|"worker", "index": N}}.
//               "chief" is not accepted: pstrain has no chief, a TFJob runs
//               its workers as Worker replicas.
//   Slurm       SLURM_PROCID: one srun step of SLURM_NTASKS tasks over
//               the step's nodes (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST)
//               with SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE).
//               Tasks lie on the nodes in Slurm's default block distribution:
//               the first count[0] tasks on the first node, and so on. Tasks
//               0..P-1 are the servers, the rest the workers in order.
//               SLURMD_NODENAME, where set, must be the node the rule gives.
//   Kubernetes  KUBERNETES_SERVICE_HOST: the pod is StatefulSet member
//               HOSTNAME = <job>-ps-N or <job>-worker-N, and process N of a
//               role is reached at <job>-ps-N.<job>-ps (the headless Service
//               of the StatefulSet), <job>-worker-N.<job>-worker.
// Every process of one job sees the same cluster part of the environment, so
// every process computes the same hosts (and thus the same config hash).
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "shared/error.h"

namespace pstrain {

// A missing or inconsistent scheduler variable; the message names it.
struct SchedulerError : pstrain::Error {
  using pstrain::Error::Error;
};

using Environment = std::map<std::string, std::string>;

// The process's own environment (environ) as a map.
Environment process_environment();

struct Address {
  std::string host;
  std::optional<std::uint16_t> port;  // TF_CONFIG gives one; the others do not
};

struct Placement {
  std::string source;  // "TF_CONFIG", "slurm" or "kubernetes"
  std::string role;    // "ps" or "worker"
  std::uint32_t index = 0;
  std::vector<Address> ps;       // every server, by index
  std::vector<Address> workers;  // every worker, by index
};

// The name of the first source whose variable is set and not empty
// ("TF_CONFIG", "slurm", "kubernetes"), or nullopt: this process was not
// started by a scheduler pstrain knows.
std::optional<std::string> scheduler_source(const Environment& env);

// The placement the scheduler gave this process of a job of `ps_count`
// servers and `worker_count` workers named `job`, or nullopt when no
// scheduler's variables are set. Throws SchedulerError naming the variable
// that is missing, malformed or disagrees with the counts.
std::optional<Placement> placement_from_environment(const Environment& env, std::uint32_t ps_count,
                                                    std::uint32_t worker_count,
                                                    const std::string& job);

// Slurm's hostlist syntax expanded, in order: "node[01-03,07],gpu-a[1-2]" ->
// node01 node02 node03 node07 gpu-a1 gpu-a2. A range keeps the width of its
// first bound when that has leading zeros ("[08-10]" -> 08 09 10). Several
// bracket groups in one name expand as a product ("r[1-2]n[1-2]" -> r1n1 r1n2
// r2n1 r2n2). Throws SchedulerError on malformed text (unbalanced brackets,
// a range that runs backwards, an empty name).
std::vector<std::string> expand_hostlist(std::string_view text);

// Slurm's tasks-per-node list expanded: "2(x3),1" -> 2 2 2 1. Throws
// SchedulerError on malformed text.
std::vector<std::uint32_t> expand_tasks_per_node(std::string_view text);

}  // namespace pstrain
