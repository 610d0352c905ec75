#include "shared/scheduler_env.h"

#include <unistd.h>  // environ
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <numeric>

namespace pstrain {

Environment process_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string_view text(*entry);
    const auto eq = text.find('=');
    if (eq != std::string_view::npos)
      env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

namespace {

[[noreturn]] void fail(const std::string& what) { throw SchedulerError(what); }

// The whole of `text` as a non-negative integer of type T, or nullopt.
template <class T>
std::optional<T> whole_number(std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::string count_text(std::uint32_t ps, std::uint32_t workers) {
  return std::to_string(ps) + " ps + " + std::to_string(workers) + " workers";
}

// ---- Slurm's hostlist syntax.

// Splits at commas outside brackets.
std::vector<std::string_view> split_top_level(std::string_view text, std::string_view whole) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') ++depth;
    if (text[i] == ']' && --depth < 0)
      fail("hostlist '" + std::string(whole) + "': unbalanced ']'");
    if (text[i] == ',' && depth == 0) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) fail("hostlist '" + std::string(whole) + "': unbalanced '['");
  parts.push_back(text.substr(start));
  return parts;
}

// "01-03" or "7": the numbers as text, zero-padded to the first bound's width
// when that starts with 0.
void expand_range(std::string_view range, std::string_view whole, std::vector<std::string>& out) {
  const auto dash = range.find('-');
  const std::string_view lo_text = range.substr(0, dash);
  const std::string_view hi_text =
      dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
  const auto lo = whole_number<std::uint64_t>(lo_text);
  const auto hi = whole_number<std::uint64_t>(hi_text);
  if (!lo || !hi || *hi < *lo || *hi - *lo > 100000)
    fail("hostlist '" + std::string(whole) + "': bad range '" + std::string(range) + "'");
  const std::size_t width = lo_text.size() > 1 && lo_text[0] == '0' ? lo_text.size() : 0;
  for (auto n = *lo; n <= *hi; ++n) {
    std::string digits = std::to_string(n);
    if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
    out.push_back(std::move(digits));
  }
}

// One name, its bracket groups expanded left to right as a product.
void expand_name(std::string_view name, std::string_view whole, std::vector<std::string>& out) {
  const auto open = name.find('[');
  if (open == std::string_view::npos) {
    out.emplace_back(name);
    return;
  }
  const auto close = name.find(']', open);
  if (close == std::string_view::npos || close == open + 1)
    fail("hostlist '" + std::string(whole) + "': bad brackets in '" + std::string(name) + "'");
  std::vector<std::string> numbers;
  for (const auto range : split_top_level(name.substr(open + 1, close - open - 1), whole))
    expand_range(range, whole, numbers);
  const std::string prefix(name.substr(0, open));
  const std::string_view rest = name.substr(close + 1);
  for (const auto& number : numbers) {
    std::vector<std::string> tails;
    expand_name(rest, whole, tails);
    for (const auto& tail : tails) out.push_back(prefix + number + tail);
  }
}

// ---- The sources.

std::string variable(const Environment& env, const std::string& name, const std::string& source) {
  const auto it = env.find(name);
  if (it == env.end() || it->second.empty()) fail(name + " is not set (needed for " + source + ")");
  return it->second;
}

const std::string* find(const Environment& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

// "host:port" from TF_CONFIG's cluster lists; IPv6 as "[::1]:port".
Address tf_address(const std::string& entry, const std::string& where) {
  const auto colon = entry.rfind(':');
  const auto port = colon == std::string::npos
                        ? std::nullopt
                        : whole_number<std::uint16_t>(std::string_view(entry).substr(colon + 1));
  if (!port || *port == 0 || colon == 0)
    fail("TF_CONFIG: " + where + ": expected \"host:port\", got \"" + entry + "\"");
  std::string host = entry.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, *port};
}

std::vector<Address> tf_role_list(const YAML::Node& cluster, const std::string& role,
                                  std::uint32_t expected) {
  const YAML::Node list = cluster[role];
  if (!list || !list.IsSequence())
    fail("TF_CONFIG: cluster." + role + " is missing or not a list of \"host:port\"");
  if (list.size() != expected)
    fail("TF_CONFIG: cluster." + role + " has " + std::to_string(list.size()) +
         " entries but cluster.yaml asks for " + std::to_string(expected));
  std::vector<Address> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = "cluster." + role + "[" + std::to_string(i) + "]";
    if (!list[i].IsScalar()) fail("TF_CONFIG: " + where + ": expected \"host:port\"");
    out.push_back(tf_address(list[i].Scalar(), where));
  }
  return out;
}

Placement from_tf_config(const std::string& text, std::uint32_t ps_count,
                         std::uint32_t worker_count) {
  YAML::Node root;
  try {
    root = YAML::Load(text);  // JSON is YAML
  } catch (const YAML::Exception& e) {
    fail("TF_CONFIG is not valid JSON: " + e.msg);
  }
  if (!root.IsMap() || !root["cluster"].IsMap() || !root["task"].IsMap())
    fail("TF_CONFIG: expected {\"cluster\": {...}, \"task\": {...}}");
  const YAML::Node cluster = root["cluster"], task = root["task"];
  for (const auto& kv : cluster) {
    const std::string role = kv.first.Scalar();
    if (role != "ps" && role != "worker")
      fail("TF_CONFIG: cluster." + role + ": pstrain has only ps and worker replicas");
  }
  Placement p;
  p.source = "TF_CONFIG";
  p.ps = tf_role_list(cluster, "ps", ps_count);
  p.workers = tf_role_list(cluster, "worker", worker_count);
  if (!task["type"].IsScalar() ||
      (task["type"].Scalar() != "ps" && task["type"].Scalar() != "worker"))
    fail("TF_CONFIG: task.type: expected \"ps\" or \"worker\", got " +
         (task["type"].IsScalar() ? "\"" + task["type"].Scalar() + "\"" : std::string("none")));
  p.role = task["type"].Scalar();
  const auto index =
      task["index"].IsScalar() ? whole_number<std::uint32_t>(task["index"].Scalar()) : std::nullopt;
  if (!index) fail("TF_CONFIG: task.index: expected a non-negative integer");
  p.index = *index;
  const auto& list = p.role == "ps" ? p.ps : p.workers;
  if (p.index >= list.size())
    fail("TF_CONFIG: task.index " + std::to_string(p.index) + " but cluster." + p.role + " has " +
         std::to_string(list.size()) + " entries");
  return p;
}

Placement from_slurm(const Environment& env, std::uint32_t ps_count, std::uint32_t worker_count) {
  const std::string source = "a Slurm task";
  const auto procid = whole_number<std::uint32_t>(variable(env, "SLURM_PROCID", source));
  if (!procid) fail("SLURM_PROCID is '" + env.at("SLURM_PROCID") + "', not a task number");
  const auto ntasks_text = variable(env, "SLURM_NTASKS", source);
  const auto ntasks = whole_number<std::uint32_t>(ntasks_text);
  if (!ntasks) fail("SLURM_NTASKS is '" + ntasks_text + "', not a number");
  if (*ntasks != ps_count + worker_count)
    fail("SLURM_NTASKS is " + ntasks_text + " but cluster.yaml asks for " +
         count_text(ps_count, worker_count));
  if (*procid >= *ntasks)
    fail("SLURM_PROCID " + std::to_string(*procid) + " is not below SLURM_NTASKS " + ntasks_text);

  // The step's own lists where srun set them, else the job's.
  const auto either = [&](const char* step, const char* job) {
    return find(env, step) ? std::string(step) : std::string(job);
  };
  const std::string nodelist_var = either("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
  const std::string per_node_var = either("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
  const std::string nodelist_text = variable(env, nodelist_var, source);
  const std::string per_node_text = variable(env, per_node_var, source);
  std::vector<std::string> nodes;
  std::vector<std::uint32_t> per_node;
  try {
    nodes = expand_hostlist(nodelist_text);
  } catch (const SchedulerError& e) {
    fail(nodelist_var + ": " + e.what());
  }
  try {
    per_node = expand_tasks_per_node(per_node_text);
  } catch (const SchedulerError& e) {
    fail(per_node_var + ": " + e.what());
  }
  if (nodes.size() != per_node.size())
    fail(nodelist_var + " names " + std::to_string(nodes.size()) + " nodes but " + per_node_var +
         " gives counts for " + std::to_string(per_node.size()));
  const auto total = std::accumulate(per_node.begin(), per_node.end(), std::uint64_t{0});
  if (total != *ntasks)
    fail(per_node_var + " adds up to " + std::to_string(total) + " tasks but SLURM_NTASKS is " +
         ntasks_text);

  std::vector<std::string> task_host;  // block distribution
  for (std::size_t n = 0; n < nodes.size(); ++n)
    task_host.insert(task_host.end(), per_node[n], nodes[n]);
  if (const auto* own = find(env, "SLURMD_NODENAME"); own && *own != task_host[*procid])
    fail("SLURMD_NODENAME is " + *own + " but block distribution puts task " +
         std::to_string(*procid) + " on " + task_host[*procid] +
         " (run the step with --distribution=block, Slurm's default)");

  Placement p;
  p.source = "slurm";
  for (std::uint32_t t = 0; t < *ntasks; ++t)
    (t < ps_count ? p.ps : p.workers).push_back({task_host[t], std::nullopt});
  p.role = *procid < ps_count ? "ps" : "worker";
  p.index = *procid < ps_count ? *procid : *procid - ps_count;
  return p;
}

Placement from_kubernetes(const Environment& env, std::uint32_t ps_count,
                          std::uint32_t worker_count, const std::string& job) {
  const std::string hostname = variable(env, "HOSTNAME", "a Kubernetes pod");
  Placement p;
  p.source = "kubernetes";
  for (const std::string role : {"ps", "worker"}) {
    const std::string prefix = job + "-" + role + "-";
    if (hostname.rfind(prefix, 0) != 0) continue;
    const auto ordinal =
        whole_number<std::uint32_t>(std::string_view(hostname).substr(prefix.size()));
    if (!ordinal) continue;
    p.role = role;
    p.index = *ordinal;
  }
  if (p.role.empty())
    fail("HOSTNAME is '" + hostname + "' but a pod of job '" + job + "' is named " + job +
         "-ps-N or " + job + "-worker-N (a StatefulSet member)");
  const std::uint32_t count = p.role == "ps" ? ps_count : worker_count;
  if (p.index >= count)
    fail("HOSTNAME is '" + hostname + "' but cluster.yaml asks for " + std::to_string(count) + " " +
         p.role + " (ordinals 0.." + std::to_string(count) + "-1)");
  const auto names = [&](const std::string& role, std::uint32_t n, std::vector<Address>& out) {
    for (std::uint32_t i = 0; i < n; ++i)
      out.push_back(
          {job + "-" + role + "-" + std::to_string(i) + "." + job + "-" + role, std::nullopt});
  };
  names("ps", ps_count, p.ps);
  names("worker", worker_count, p.workers);
  return p;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view text) {
  std::vector<std::string> hosts;
  for (const auto name : split_top_level(text, text)) {
    if (name.empty()) fail("hostlist '" + std::string(text) + "': empty name");
    expand_name(name, text, hosts);
  }
  return hosts;
}

std::vector<std::uint32_t> expand_tasks_per_node(std::string_view text) {
  std::vector<std::uint32_t> counts;
  const auto bad = [&] { fail("expected counts like 2(x3),1, got '" + std::string(text) + "'"); };
  std::size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(start, end - start);
    const auto paren = item.find("(x");
    const auto count = whole_number<std::uint32_t>(item.substr(0, paren));
    std::optional<std::uint32_t> repeat = 1;
    if (paren != std::string_view::npos) {
      if (item.back() != ')') bad();
      repeat = whole_number<std::uint32_t>(item.substr(paren + 2, item.size() - paren - 3));
    }
    if (!count || !repeat || *repeat == 0 || *repeat > 100000) bad();
    counts.insert(counts.end(), *repeat, *count);
    start = end + 1;
  }
  return counts;
}

std::optional<std::string> scheduler_source(const Environment& env) {
  const auto set = [&](const char* name) {
    const auto* value = find(env, name);
    return value && !value->empty();
  };
  if (set("TF_CONFIG")) return "TF_CONFIG";
  if (set("SLURM_PROCID")) return "slurm";
  if (set("KUBERNETES_SERVICE_HOST")) return "kubernetes";
  return std::nullopt;
}

std::optional<Placement> placement_from_environment(const Environment& env, std::uint32_t ps_count,
                                                    std::uint32_t worker_count,
                                                    const std::string& job) {
  const auto source = scheduler_source(env);
  if (!source) return std::nullopt;
  if (*source == "TF_CONFIG") return from_tf_config(env.at("TF_CONFIG"), ps_count, worker_count);
  if (*source == "slurm") return from_slurm(env, ps_count, worker_count);
  return from_kubernetes(env, ps_count, worker_count, job);
}

}  // namespace pstrain
