#include "shared/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <limits>
#include <iterator>
#include <map>
#include <system_error>

#include "shared/init.h"
#include "shared/shard_map.h"

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
  return mode == Mode::sync ? "sync" : "async";
}

std::string_view to_string(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
    case Device::auto_: return "auto";
  }
  return "unknown";
}

namespace {

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string listed(const std::vector<std::string>& names, std::string_view last_sep) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += (i + 1 == names.size()) ? last_sep : ", ";
    out += names[i];
  }
  return out;
}

// Shortest text that reads back to the same value, so to_yaml round-trips.
template <class T>
std::string number(T value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, end);
}

// How a node that was not what we wanted looks to the user.
std::string shown(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    default: return "nothing";
  }
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// A closed or open interval, spelled out in error messages.
struct Range {
  double lo = -kInf;
  bool lo_open = false;
  double hi = kInf;
  bool hi_open = false;

  bool contains(double x) const {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  std::string text(std::string_view noun) const {
    const auto num = number<double>;
    const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
    std::string out(noun);
    if (has_lo && has_hi && !lo_open && !hi_open) return out + " in " + num(lo) + ".." + num(hi);
    if (has_lo && has_hi) {
      return out + " in " + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) +
             (hi_open ? ")" : "]");
    }
    if (has_lo) return out + (lo_open ? " > " : " >= ") + num(lo);
    if (has_hi) return out + (hi_open ? " < " : " <= ") + num(hi);
    return out;
  }
};

const Range kPositive{0, true, kInf, false};
const Range kNonNegative{0, false, kInf, false};
const Range kUnitOpen{0, false, 1, true};  // [0, 1)

Range at_least(double lo) { return Range{lo, false, kInf, false}; }
Range between(double lo, double hi) { return Range{lo, false, hi, false}; }

// Reads and checks one document; every error names `origin` and the key's
// dotted path.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError(origin_ + ": " + (path.empty() ? "" : path + ": ") + what);
  }

  // `node` must be a map whose keys all come from `allowed`. An empty entry
  // (`train:` with every key commented out) counts as an empty map.
  void keys(const YAML::Node& node, const std::string& path,
            const std::vector<std::string>& allowed, std::string_view what) const {
    if (node.IsNull()) return;
    if (!node.IsMap()) fail(path, "expected " + std::string(what) + ", got " + shown(node));
    std::vector<std::string> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) fail(path, "keys must be plain names, got " + shown(kv.first));
      const std::string key = kv.first.Scalar();
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        fail(join(path, key), "unknown key (expected one of: " + listed(allowed, ", ") + ")");
      }
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        fail(join(path, key), "given more than once");
      }
      seen.push_back(key);
    }
  }

  std::string text(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar() || node.Scalar().empty()) {
      fail(path, "expected a non-empty string, got " + shown(node));
    }
    return node.Scalar();
  }

  std::string choice(const YAML::Node& node, const std::string& path,
                     const std::vector<std::string>& options) const {
    if (node.IsScalar() &&
        std::find(options.begin(), options.end(), node.Scalar()) != options.end()) {
      return node.Scalar();
    }
    fail(path, "expected " + listed(options, " or ") + ", got " + shown(node));
  }

  template <class T>
  T integer(const YAML::Node& node, const std::string& path, Range range) const {
    const std::string expected = range.text("an integer");
    if (!node.IsScalar()) fail(path, "expected " + expected + ", got " + shown(node));
    const std::string& s = node.Scalar();
    T value{};
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size() ||
        !range.contains(static_cast<double>(value))) {
      fail(path, "expected " + expected + ", got " + shown(node));
    }
    return value;
  }

  template <class T>
  T real(const YAML::Node& node, const std::string& path, Range range) const {
    const std::string expected = range.text("a number");
    if (!node.IsScalar()) fail(path, "expected " + expected + ", got " + shown(node));
    const std::string& s = node.Scalar();
    T value{};
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value) ||
        !range.contains(static_cast<double>(value))) {
      fail(path, "expected " + expected + ", got " + shown(node));
    }
    return value;
  }

  bool boolean(const YAML::Node& node, const std::string& path) const {
    bool value = false;
    if (!node.IsScalar() || !YAML::convert<bool>::decode(node, value)) {
      fail(path, "expected true or false, got " + shown(node));
    }
    return value;
  }

 private:
  std::string origin_;
};

const std::vector<std::string> kRootKeys = {"job", "run_dir", "mode",  "ps",    "workers",
                                            "optimizer", "model", "data", "train", "net"};

void read_ps(const Reader& r, const YAML::Node& node, ClusterConfig& c) {
  if (!node.IsSequence() || node.size() == 0) {
    r.fail("ps", "expected a non-empty list of {host, port}, got " + shown(node));
  }
  std::map<std::string, std::size_t> seen;  // "host:port" -> first index
  for (std::size_t i = 0; i < node.size(); ++i) {
    const std::string path = "ps." + std::to_string(i);
    const YAML::Node entry = node[i];
    r.keys(entry, path, {"host", "port", "bind"}, "a map {host, port, bind}");
    if (!entry["host"]) r.fail(join(path, "host"), "missing (the address others dial)");
    if (!entry["port"]) r.fail(join(path, "port"), "missing");
    PsEndpoint ps;
    ps.host = r.text(entry["host"], join(path, "host"));
    ps.port = r.integer<std::uint16_t>(entry["port"], join(path, "port"), between(1, 65535));
    if (entry["bind"]) ps.bind = r.text(entry["bind"], join(path, "bind"));
    const std::string endpoint = ps.host + ":" + std::to_string(ps.port);
    if (auto [it, fresh] = seen.emplace(endpoint, i); !fresh) {
      r.fail(path, "duplicate endpoint " + endpoint + " (also ps." +
                       std::to_string(it->second) + ")");
    }
    c.ps.push_back(std::move(ps));
  }
}

Device read_device(const Reader& r, const YAML::Node& node, const std::string& path) {
  const std::string d = r.choice(node, path, {"cpu", "cuda", "auto"});
  return d == "cpu" ? Device::cpu : d == "cuda" ? Device::cuda : Device::auto_;
}

void read_workers(const Reader& r, const YAML::Node& node, ClusterConfig& c) {
  if (node.IsScalar() && node.Scalar() == "auto") {
    c.workers_auto = true;
    return;
  }
  if (node.IsMap()) {  // the shorthand {count, host, device}
    r.keys(node, "workers", {"count", "host", "device"}, "a map {count, host, device}");
    if (!node["count"]) r.fail("workers.count", "missing (how many workers)");
    // Bounded by the port space: in sync mode every worker listens on its own port.
    const auto count =
        r.integer<std::uint32_t>(node["count"], "workers.count", between(1, 65535));
    WorkerSpec spec;
    if (node["host"]) spec.host = r.text(node["host"], "workers.host");
    if (node["device"]) spec.device = read_device(r, node["device"], "workers.device");
    c.workers.assign(count, spec);
    return;
  }
  if (!node.IsSequence() || node.size() == 0) {
    r.fail("workers",
           "expected a non-empty list of {host, device, gpu}, a map {count, host, device} "
           "or 'auto', got " + shown(node));
  }
  for (std::size_t i = 0; i < node.size(); ++i) {
    const std::string path = "workers." + std::to_string(i);
    const YAML::Node entry = node[i];
    r.keys(entry, path, {"host", "device", "gpu"}, "a map {host, device, gpu}");
    WorkerSpec spec;
    if (entry["host"]) spec.host = r.text(entry["host"], join(path, "host"));
    if (entry["device"]) spec.device = read_device(r, entry["device"], join(path, "device"));
    if (const YAML::Node gpu = entry["gpu"]; gpu && !(gpu.IsScalar() && gpu.Scalar() == "auto")) {
      spec.gpu = r.integer<int>(gpu, join(path, "gpu"), at_least(0));
    }
    c.workers.push_back(std::move(spec));
  }
}

void read_optimizer(const Reader& r, const YAML::Node& node, OptimizerConfig& o) {
  // Keys of other optimizers are accepted so that --set optimizer.name=...
  // can switch without editing the file.
  r.keys(node, "optimizer",
         {"name", "lr", "momentum", "nesterov", "beta1", "beta2", "eps",
          "initial_accumulator", "weight_decay"},
         "a map {name, lr, ...}");
  if (node["name"]) {
    o.kind = parse_optimizer_kind(
        r.choice(node["name"], "optimizer.name", {"sgd", "momentum", "adam", "adagrad"}));
  }
  auto number = [&](const char* key, float& field, Range range) {
    if (node[key]) field = r.real<float>(node[key], join("optimizer", key), range);
  };
  number("lr", o.lr, kPositive);
  number("momentum", o.momentum, kUnitOpen);
  number("beta1", o.beta1, kUnitOpen);
  number("beta2", o.beta2, kUnitOpen);
  number("eps", o.eps, kPositive);
  number("initial_accumulator", o.initial_accumulator, kNonNegative);
  number("weight_decay", o.weight_decay, kNonNegative);
  if (node["nesterov"]) o.nesterov = r.boolean(node["nesterov"], "optimizer.nesterov");
}

void read_model(const Reader& r, const YAML::Node& node, ModelConfig& m) {
  if (node.IsScalar()) {
    m.preset = r.choice(node, "model", {"mlp", "cnn"});
    return;
  }
  if (!node.IsSequence() || node.size() == 0) {
    r.fail("model", "expected mlp, cnn or a non-empty list of layers, got " + shown(node));
  }
  m.preset = "custom";
  for (std::size_t i = 0; i < node.size(); ++i) {
    const std::string path = "model." + std::to_string(i);
    const YAML::Node entry = node[i];
    if (!entry.IsMap() || !entry["type"]) {
      r.fail(path, "expected a layer {type: dense|relu|conv2d|maxpool2d|flatten, ...}, got " +
                       shown(entry));
    }
    ModelLayer layer;
    layer.type = r.choice(entry["type"], join(path, "type"),
                          {"dense", "relu", "conv2d", "maxpool2d", "flatten"});
    // Each layer type takes exactly its own sizes, so a misplaced key is
    // reported rather than silently ignored.
    std::vector<std::string> sizes;
    if (layer.type == "dense") sizes = {"units"};
    if (layer.type == "conv2d") sizes = {"filters", "kernel"};
    if (layer.type == "maxpool2d") sizes = {"kernel"};
    std::vector<std::string> allowed = {"type"};
    allowed.insert(allowed.end(), sizes.begin(), sizes.end());
    r.keys(entry, path, allowed, "a layer map");
    for (const auto& key : sizes) {
      if (!entry[key]) r.fail(join(path, key), "missing (required for a " + layer.type + " layer)");
      const int value = r.integer<int>(entry[key], join(path, key), at_least(1));
      (key == "units" ? layer.units : key == "filters" ? layer.filters : layer.kernel) = value;
    }
    m.layers.push_back(std::move(layer));
  }
}

void read_data(const Reader& r, const YAML::Node& node, DataConfig& d) {
  r.keys(node, "data", {"name", "dir", "synthetic_train", "synthetic_test"},
         "a map {name, dir, ...}");
  if (node["name"]) d.name = r.choice(node["name"], "data.name", {"fashion-mnist", "synthetic"});
  if (node["dir"]) d.dir = r.text(node["dir"], "data.dir");
  if (node["synthetic_train"]) {
    d.synthetic_train = r.integer<std::uint64_t>(node["synthetic_train"],
                                                 "data.synthetic_train", at_least(1));
  }
  if (node["synthetic_test"]) {
    d.synthetic_test = r.integer<std::uint64_t>(node["synthetic_test"], "data.synthetic_test",
                                                at_least(1));
  }
}

void read_train(const Reader& r, const YAML::Node& node, TrainConfig& t) {
  r.keys(node, "train",
         {"batch_size", "epochs", "seed", "eval_every", "threads", "sync_every", "lr_scaling",
          "warmup_steps", "straggler_worker", "straggler_delay_ms", "bucket_bytes"},
         "a map {batch_size, epochs, ...}");
  auto u32 = [&](const char* key, std::uint32_t& field, std::uint32_t lo) {
    if (node[key]) field = r.integer<std::uint32_t>(node[key], join("train", key), at_least(lo));
  };
  auto u64 = [&](const char* key, std::uint64_t& field) {
    if (node[key]) {
      field = r.integer<std::uint64_t>(node[key], join("train", key), at_least(0));
    }
  };
  auto real = [&](const char* key, double& field, Range range) {
    if (node[key]) field = r.real<double>(node[key], join("train", key), range);
  };
  u32("batch_size", t.batch_size, 1);
  real("epochs", t.epochs, kPositive);
  u64("seed", t.seed);
  u64("eval_every", t.eval_every);
  u32("threads", t.threads, 1);
  u32("sync_every", t.sync_every, 1);
  if (node["lr_scaling"]) t.lr_scaling = r.boolean(node["lr_scaling"], "train.lr_scaling");
  u32("warmup_steps", t.warmup_steps, 0);
  if (node["straggler_worker"]) {
    t.straggler_worker =
        r.integer<std::int32_t>(node["straggler_worker"], "train.straggler_worker", at_least(-1));
  }
  real("straggler_delay_ms", t.straggler_delay_ms, kNonNegative);
  u32("bucket_bytes", t.bucket_bytes, 4);
}

void read_net(const Reader& r, const YAML::Node& node, NetConfig& n) {
  r.keys(node, "net",
         {"chunk_bytes", "request_timeout", "worker_timeout", "heartbeat"},
         "a map {chunk_bytes, request_timeout, ...}");
  if (node["chunk_bytes"]) {
    n.chunk_bytes = r.integer<std::uint64_t>(node["chunk_bytes"], "net.chunk_bytes",
                                             between(4, ShardMap::kMaxChunkBytes));
  }
  auto seconds = [&](const char* key, double& field) {
    if (node[key]) field = r.real<double>(node[key], join("net", key), kPositive);
  };
  seconds("request_timeout", n.request_timeout);
  seconds("worker_timeout", n.worker_timeout);
  seconds("heartbeat", n.heartbeat);
}

// Constraints between sections, checked once every section is read.
void check_across(const Reader& r, const ClusterConfig& c) {
  if (c.net.heartbeat >= c.net.worker_timeout) {
    r.fail("net.heartbeat", "must be shorter than net.worker_timeout (" +
                                number(c.net.worker_timeout) +
                                " s), or every ps would time out live workers");
  }
  if (c.workers_auto) return;
  const auto workers = static_cast<std::int64_t>(c.workers.size());
  if (c.train.straggler_worker >= workers) {
    r.fail("train.straggler_worker", std::to_string(c.train.straggler_worker) +
                                         " is not a worker index (there are " +
                                         std::to_string(workers) + " workers; -1: none)");
  }
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

std::optional<std::size_t> as_index(const std::string& s) {
  std::size_t i = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return i;
}

// Sets one "dotted.key=value" in the tree. Missing map keys are created, so
// a misspelt key reaches validation and is reported as unknown there.
void apply_override(YAML::Node& root, const std::string& item) {
  const auto fail = [&](const std::string& what) -> ConfigError {
    return ConfigError("--set '" + item + "': " + what);
  };
  const std::size_t eq = item.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw fail("expected key=value (e.g. optimizer.lr=0.05)");
  }
  const std::vector<std::string> keys = split_key(item.substr(0, eq));
  if (std::any_of(keys.begin(), keys.end(), [](const auto& k) { return k.empty(); })) {
    throw fail("empty part in the key");
  }
  const std::string text = item.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    // A bare word YAML reserves, such as '*' for a bind address, is meant as
    // a string; broken lists and maps are reported.
    if (text.find_first_of("[{\"'") == 0) {
      throw fail("the value is not valid YAML (" + e.msg + ")");
    }
    value = YAML::Node(text);
  }

  // yaml-cpp nodes are handles: assigning one to another writes through, so
  // the walk moves with reset().
  YAML::Node node;
  node.reset(root);
  std::string walked;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    const bool last = i + 1 == keys.size();
    YAML::Node next;
    if (node.IsSequence()) {
      const auto index = as_index(key);
      if (!index || *index > node.size() || (*index == node.size() && !last)) {
        throw fail(walked + " is a list of " + std::to_string(node.size()) + " entries; '" +
                   key + "' is not an index of it (to replace the whole list: " + walked +
                   "=...)");
      }
      if (*index == node.size()) {
        node.push_back(value);
        return;
      }
      next.reset(node[*index]);
    } else if (node.IsMap() || node.IsNull() || !node.IsDefined()) {
      if (last) {
        node[key] = value;
        return;
      }
      if (!node[key] || node[key].IsNull()) node[key] = YAML::Node(YAML::NodeType::Map);
      next.reset(node[key]);
    } else {
      throw fail(walked + " is a single value, not a map or list");
    }
    if (last) {
      next = value;
      return;
    }
    walked = join(walked, key);
    node.reset(next);
  }
}

ClusterConfig read_config(const Reader& r, const YAML::Node& root) {
  r.keys(root, "", kRootKeys, "a map of settings (job, ps, workers, ...)");
  ClusterConfig c;
  if (root["job"]) {
    c.job = r.text(root["job"], "job");
    const auto name_char = [](unsigned char ch) {
      return std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-';
    };
    if (!std::all_of(c.job.begin(), c.job.end(), name_char)) {
      r.fail("job", "expected a name of letters, digits, '.', '_' and '-', got '" + c.job + "'");
    }
  }
  c.run_dir = root["run_dir"] ? std::filesystem::path(r.text(root["run_dir"], "run_dir"))
                              : std::filesystem::path("runs") / c.job;
  if (root["mode"]) {
    c.mode = r.choice(root["mode"], "mode", {"async", "sync"}) == "sync" ? Mode::sync : Mode::async;
  }
  if (!root["ps"]) r.fail("ps", "missing (the list of parameter servers, [{host, port}, ...])");
  read_ps(r, root["ps"], c);
  if (!root["workers"]) {
    r.fail("workers", "missing (a list of workers, {count: N} or auto)");
  }
  read_workers(r, root["workers"], c);
  if (root["optimizer"]) read_optimizer(r, root["optimizer"], c.optimizer);
  if (root["model"]) read_model(r, root["model"], c.model);
  if (root["data"]) read_data(r, root["data"], c.data);
  if (root["train"]) read_train(r, root["train"], c.train);
  if (root["net"]) read_net(r, root["net"], c.net);
  check_across(r, c);
  return c;
}

}  // namespace

ClusterConfig parse_config(const std::string& yaml_text,
                           const std::vector<std::string>& overrides,
                           const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    const std::string where =
        e.mark.is_null() ? origin
                         : origin + ":" + std::to_string(e.mark.line + 1) + ":" +
                               std::to_string(e.mark.column + 1);
    throw ConfigError(where + ": YAML syntax error: " + e.msg);
  }
  const Reader reader(origin);
  if (root.IsNull() || !root.IsDefined()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    reader.fail("", "expected a map of settings (job, ps, workers, ...), got " + shown(root));
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
  using YAML::BeginMap, YAML::EndMap, YAML::BeginSeq, YAML::EndSeq, YAML::Flow, YAML::Key,
      YAML::Value;
  YAML::Emitter out;
  auto field = [&](const char* key, const std::string& value) {
    out << Key << key << Value << value;
  };
  out << BeginMap;
  field("job", job);
  field("run_dir", run_dir.string());
  field("mode", std::string(to_string(mode)));

  out << Key << "ps" << Value << BeginSeq;
  for (const auto& p : ps) {
    out << Flow << BeginMap;
    field("host", p.host);
    field("port", number(p.port));
    field("bind", p.bind.empty() ? p.host : p.bind);
    out << EndMap;
  }
  out << EndSeq;

  out << Key << "workers" << Value;
  if (workers_auto) {
    out << "auto";
  } else {
    out << BeginSeq;
    for (const auto& w : workers) {
      out << Flow << BeginMap;
      field("host", w.host);
      field("device", std::string(to_string(w.device)));
      field("gpu", w.gpu < 0 ? std::string("auto") : number(w.gpu));
      out << EndMap;
    }
    out << EndSeq;
  }

  out << Key << "optimizer" << Value << BeginMap;
  field("name", std::string(pstrain::to_string(optimizer.kind)));
  field("lr", number(optimizer.lr));
  field("momentum", number(optimizer.momentum));
  field("nesterov", optimizer.nesterov ? "true" : "false");
  field("beta1", number(optimizer.beta1));
  field("beta2", number(optimizer.beta2));
  field("eps", number(optimizer.eps));
  field("initial_accumulator", number(optimizer.initial_accumulator));
  field("weight_decay", number(optimizer.weight_decay));
  out << EndMap;

  out << Key << "model" << Value;
  if (model.preset != "custom") {
    out << model.preset;
  } else {
    out << BeginSeq;
    for (const auto& l : model.layers) {
      out << Flow << BeginMap;
      field("type", l.type);
      if (l.type == "dense") field("units", number(l.units));
      if (l.type == "conv2d") field("filters", number(l.filters));
      if (l.type == "conv2d" || l.type == "maxpool2d") field("kernel", number(l.kernel));
      out << EndMap;
    }
    out << EndSeq;
  }

  out << Key << "data" << Value << BeginMap;
  field("name", data.name);
  field("dir", data.dir.string());
  field("synthetic_train", number(data.synthetic_train));
  field("synthetic_test", number(data.synthetic_test));
  out << EndMap;

  out << Key << "train" << Value << BeginMap;
  field("batch_size", number(train.batch_size));
  field("epochs", number(train.epochs));
  field("seed", number(train.seed));
  field("eval_every", number(train.eval_every));
  field("threads", number(train.threads));
  field("sync_every", number(train.sync_every));
  field("lr_scaling", train.lr_scaling ? "true" : "false");
  field("warmup_steps", number(train.warmup_steps));
  field("straggler_worker", number(train.straggler_worker));
  field("straggler_delay_ms", number(train.straggler_delay_ms));
  field("bucket_bytes", number(train.bucket_bytes));
  out << EndMap;

  out << Key << "net" << Value << BeginMap;
  field("chunk_bytes", number(net.chunk_bytes));
  field("request_timeout", number(net.request_timeout));
  field("worker_timeout", number(net.worker_timeout));
  field("heartbeat", number(net.heartbeat));
  out << EndMap;

  out << EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {

std::string scalar_text(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "(absent)";
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

void diff_nodes(const YAML::Node& a, const YAML::Node& b, const std::string& path,
                std::vector<std::string>& out) {
  if (a.IsMap() && b.IsMap()) {
    std::vector<std::string> keys;
    for (const auto& kv : a) keys.push_back(kv.first.Scalar());
    for (const auto& kv : b)
      if (!a[kv.first.Scalar()]) keys.push_back(kv.first.Scalar());
    for (const auto& k : keys) diff_nodes(a[k], b[k], join(path, k), out);
    return;
  }
  if (a.IsSequence() && b.IsSequence() && a.size() == b.size()) {
    for (std::size_t i = 0; i < a.size(); ++i) diff_nodes(a[i], b[i], join(path, std::to_string(i)), out);
    return;
  }
  const auto at = scalar_text(a), bt = scalar_text(b);
  if (at != bt) out.push_back(path + ": " + at + " vs " + bt);
}

}  // namespace

std::string config_differences(const std::string& a_yaml, const std::string& b_yaml,
                               std::size_t limit) {
  std::vector<std::string> found;
  try {
    diff_nodes(YAML::Load(a_yaml), YAML::Load(b_yaml), "", found);
  } catch (const YAML::Exception&) {
    return "(a configuration could not be read)";
  }
  std::string text;
  for (std::size_t i = 0; i < found.size() && i < limit; ++i)
    text += (i ? "; " : "") + found[i];
  if (found.size() > limit) text += "; and " + std::to_string(found.size() - limit) + " more";
  return text;
}

std::uint64_t ClusterConfig::hash() const { return fnv1a64(to_yaml()); }

}  // namespace pstrain
