// bench_ps: push, pull and push_pull through PsClient against real parameter
// servers (forked children on loopback tcp), alternated rep by rep with raw
// ZeroMQ DEALER->ROUTER moving the same bytes in the same chunks:
//   push: SIZE out, 8 B ack;  pull: 8 B out, SIZE back;  push_pull: SIZE both ways
// GB/s counts SIZE for push and pull and 2 x SIZE for push_pull. The ps runs
// SGD; the time it spends in the optimizer (from its stats) is reported per
// operation. Medians of 7 reps.
//
// Then the same operations with security.curve (ZeroMQ CURVE: encryption and
// the ps's key check) against the plain client, alternated rep by rep, with
// the throughput of each and their ratio.
//
//   bench_ps [--chunk-bytes N] [--reps N]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "client/ps_client.h"
#include "server/ps_role.h"
#include "shared/child_process.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr std::uint64_t kSizes[] = {4 * kKiB, 64 * kKiB, kMiB, 16 * kMiB, 64 * kMiB};
enum class Op { push, pull, push_pull };
constexpr Op kOps[] = {Op::push, Op::pull, Op::push_pull};
const char* name(Op op) {
  return op == Op::push ? "push" : op == Op::pull ? "pull" : "push_pull";
}

std::string size_name(std::uint64_t bytes) {
  return bytes >= kMiB ? std::to_string(bytes / kMiB) + " MiB" : std::to_string(bytes / kKiB) + " KiB";
}
std::string var_name(std::uint64_t bytes) { return "v" + std::to_string(bytes); }

// Operations per timed rep: enough that small sizes are not one syscall's
// noise, few enough that 64 MiB stays quick.
int ops_per_rep(std::uint64_t bytes) {
  return static_cast<int>(std::clamp<std::uint64_t>(64 * kMiB / bytes, 4, 200));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The raw peer: replies to [u64 reply size][payload?] with a frame of that
// size, sent zero-copy from a static buffer, like the ps sends its values.
int raw_server(std::uint16_t port) {
  static std::vector<char> data(ShardMap::kMaxChunkBytes);
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
  s.bind("tcp://127.0.0.1:" + std::to_string(port));
  std::vector<zmq::message_t> frames;
  while (true) {
    frames.clear();
    if (!zmq::recv_multipart(s, std::back_inserter(frames))) continue;
    std::uint64_t reply = 0;
    std::memcpy(&reply, frames[1].data(), sizeof reply);
    s.send(frames[0], zmq::send_flags::sndmore);
    s.send(zmq::message_t(data.data(), reply, [](void*, void*) {}), zmq::send_flags::none);
  }
}

class RawClient {
 public:
  RawClient(const std::vector<std::uint16_t>& ports) {
    for (auto p : ports) {
      auto& s = sockets_.emplace_back(ctx_, zmq::socket_type::dealer);
      s.set(zmq::sockopt::sndhwm, 0);
      s.set(zmq::sockopt::rcvhwm, 0);
      s.connect("tcp://127.0.0.1:" + std::to_string(p));
    }
  }

  // One operation on a variable: every chunk's request in flight at once,
  // then every reply.
  void run(Op op, const ShardMap& map, std::uint32_t var, const std::vector<float>& buffer) {
    const auto chunks = map.chunks(var);
    for (const auto& c : chunks) {
      const std::uint64_t bytes = c.count * sizeof(float);
      const std::uint64_t reply = op == Op::push ? 8 : bytes;
      auto& s = sockets_[c.server];
      const bool payload = op != Op::pull;
      s.send(zmq::buffer(&reply, sizeof reply),
             payload ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (payload)
        s.send(zmq::message_t(const_cast<float*>(buffer.data() + c.offset), bytes,
                              [](void*, void*) {}),
               zmq::send_flags::none);
    }
    zmq::message_t msg;
    for (const auto& c : chunks) (void)sockets_[c.server].recv(msg);
  }

 private:
  zmq::context_t ctx_;
  std::vector<zmq::socket_t> sockets_;
};

double stat(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\":");
  if (at == std::string::npos) throw std::runtime_error("stats lack " + key + ": " + json);
  return std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

double stats_sum(PsClient& ps, std::uint32_t servers, const std::string& key) {
  double sum = 0;
  for (std::uint32_t s = 0; s < servers; ++s) sum += stat(ps.stats(s), key);
  return sum;
}

struct Setup {
  ClusterConfig config;
  std::vector<std::uint16_t> raw_ports;
};

// `curve`: security.curve on, with a fresh key set of its own; the client is
// worker 0, which may push, pull and push_pull.
Setup make_setup(std::uint32_t servers, std::uint64_t chunk_bytes, const std::filesystem::path& dir,
                 bool curve = false) {
  Setup s;
  s.config.job = "bench";
  s.config.run_dir = dir / ("ps" + std::to_string(servers) + (curve ? "-curve" : ""));
  if (curve) {
    s.config.security.curve = true;
    s.config.security.keys = s.config.run_dir / "keys";
    write_cluster_keys(s.config.security.keys, servers, 1);
  }
  for (std::uint32_t i = 0; i < servers; ++i) {
    PsEndpoint e;
    e.port = free_port();
    s.config.ps.push_back(e);
    s.raw_ports.push_back(free_port());
  }
  s.config.workers.resize(1);
  s.config.optimizer.kind = OptimizerKind::sgd;
  s.config.optimizer.lr = 1e-6f;
  s.config.net.chunk_bytes = chunk_bytes;
  s.config.net.worker_timeout = 3600;
  s.config.net.request_timeout = 120;
  return s;
}

// One client's view of one setup: our client and the raw one.
struct Target {
  std::uint32_t servers;
  std::vector<VariableSpec> vars;
  ShardMap map;
  PsClient ps;
  RawClient raw;

  Target(const Setup& setup, std::vector<VariableSpec> variables)
      : servers(static_cast<std::uint32_t>(setup.config.ps.size())),
        vars(variables),
        map(shard_map_for(setup.config, std::move(variables))),
        ps(setup.config, 0, map),
        raw(setup.raw_ports) {
    ps.hello();
    ps.init(1);
  }
};

// Seconds per operation of `n` operations `op` on variable `v` through t's PsClient.
double time_ours(Target& t, Op op, std::uint32_t v, int n, const std::vector<float>& grad,
                 std::vector<float>& out) {
  auto& ps = t.ps;
  const auto& name = t.vars[v].name;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i)
    ps.wait(op == Op::push   ? ps.push(name, grad)
            : op == Op::pull ? ps.pull(name, out)
                             : ps.push_pull(name, grad, out));
  return std::chrono::duration<double>(Clock::now() - t0).count() / n;
}

double moved_bytes(Op op, std::uint32_t v) {
  return static_cast<double>(kSizes[v]) * (op == Op::push_pull ? 2 : 1);
}

void row(Target& t, Op op, std::uint32_t v, int reps) {
  const auto bytes = kSizes[v];
  const int n = ops_per_rep(bytes);
  std::vector<float> grad(bytes / sizeof(float), 1e-3f), out(grad.size());
  std::vector<double> ours, theirs;
  auto& ps = t.ps;
  const double opt_before = stats_sum(ps, t.servers, "optimizer_seconds");
  for (int r = 0; r < reps; ++r) {
    ours.push_back(time_ours(t, op, v, n, grad, out));
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) t.raw.run(op, t.map, v, grad);
    theirs.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / n);
  }
  const double opt_ms = (stats_sum(ps, t.servers, "optimizer_seconds") - opt_before) * 1e3 /
                        (static_cast<double>(reps) * n);
  const double moved = moved_bytes(op, v);
  const double our_gbs = moved / median(ours) / 1e9, raw_gbs = moved / median(theirs) / 1e9;
  std::printf("%-10s %-7s %3u  %8.3f  %8.3f  %6.2f  %8.3f  %9.3f\n", name(op),
              size_name(bytes).c_str(), t.servers, our_gbs, raw_gbs, our_gbs / raw_gbs,
              op == Op::pull ? 0.0 : opt_ms, median(ours) * 1e3);
  std::fflush(stdout);
}

// The same operation through a plain and a CURVE cluster, alternated rep by rep.
void curve_row(Target& plain, Target& curve, Op op, std::uint32_t v, int reps) {
  const int n = ops_per_rep(kSizes[v]);
  std::vector<float> grad(kSizes[v] / sizeof(float), 1e-3f), out(grad.size());
  std::vector<double> plain_s, curve_s;
  for (int r = 0; r < reps; ++r) {
    plain_s.push_back(time_ours(plain, op, v, n, grad, out));
    curve_s.push_back(time_ours(curve, op, v, n, grad, out));
  }
  const double plain_gbs = moved_bytes(op, v) / median(plain_s) / 1e9;
  const double curve_gbs = moved_bytes(op, v) / median(curve_s) / 1e9;
  std::printf("%-10s %-7s %3u  %10.3f  %10.3f  %6.2f  %8.1fx\n", name(op),
              size_name(kSizes[v]).c_str(), plain.servers, plain_gbs, curve_gbs,
              curve_gbs / plain_gbs, plain_gbs / curve_gbs);
  std::fflush(stdout);
}

void copy_on_write_rows(Target& t, int reps) {
  auto& ps = t.ps;
  const auto servers = t.servers;
  // Copy-on-write: a push queued right behind a pull of the same chunks finds
  // the pull's buffers still on their way out and must copy them; one issued
  // after the pull completed updates in place.
  for (const auto bytes : {kMiB, 16 * kMiB}) {
    const auto name = var_name(bytes);
    std::vector<float> grad(bytes / sizeof(float), 1e-3f), out(grad.size());
    for (const bool pipelined : {false, true}) {
      const double cow_before = stats_sum(ps, servers, "copies_on_write");
      const double upd_before = stats_sum(ps, servers, "updates");
      std::vector<double> times;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        if (pipelined) {
          const auto a = ps.pull(name, out);
          const auto b = ps.push(name, grad);
          ps.wait(a);
          ps.wait(b);
        } else {
          ps.wait(ps.pull(name, out));
          ps.wait(ps.push(name, grad));
        }
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::printf("pull+push %-7s %3u  %-10s %8.3f ms  copies-on-write %.0f of %.0f updates\n",
                  size_name(bytes).c_str(), servers, pipelined ? "pipelined" : "sequential",
                  median(times) * 1e3, stats_sum(ps, servers, "copies_on_write") - cow_before,
                  stats_sum(ps, servers, "updates") - upd_before);
    }
  }
}

std::uint64_t parse_arg(const char* text, const char* flag) {
  std::uint64_t v = 0;
  const auto end = text + std::strlen(text);
  if (std::from_chars(text, end, v).ptr != end || v == 0)
    throw std::invalid_argument(std::string(flag) + ": expected a positive integer, got '" +
                                text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t chunk_bytes = ShardMap::kDefaultChunkBytes;
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--chunk-bytes" || arg == "--reps") && i + 1 < argc) {
      const auto v = parse_arg(argv[++i], arg.c_str());
      if (arg == "--reps") reps = static_cast<int>(v);
      else chunk_bytes = v;
    } else {
      std::fprintf(stderr, "usage: bench_ps [--chunk-bytes N] [--reps N]\n");
      return 2;
    }
  }
  TempDir dir;
  const Setup setups[] = {make_setup(1, chunk_bytes, dir.path()), make_setup(2, chunk_bytes, dir.path()),
                          make_setup(1, chunk_bytes, dir.path(), true),
                          make_setup(2, chunk_bytes, dir.path(), true)};
  constexpr std::size_t kPlainSetups = 2;  // then the same with CURVE
  // Every server is forked before this process creates a ZeroMQ context.
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (const auto& s : setups)
    for (std::uint32_t i = 0; i < s.config.ps.size(); ++i) {
      const auto log = dir.path() / "servers.log";
      children.push_back(std::make_unique<ChildProcess>(
          log, [&, i] { return run_ps_role(s.config, i, std::nullopt); }));
      children.push_back(
          std::make_unique<ChildProcess>(log, [&, i] { return raw_server(s.raw_ports[i]); }));
    }

  std::printf("bench_ps: loopback tcp, 1 client, chunk size %s, SGD on the ps, median of %d reps\n",
              size_name(chunk_bytes).c_str(), reps);
  std::printf("raw = ZeroMQ DEALER->ROUTER with the same chunks in flight; push_pull counts 2 x size\n\n");
  std::printf("%-10s %-7s %3s  %8s  %8s  %6s  %8s  %9s\n", "op", "size", "ps", "ours GB/s",
              "raw GB/s", "ratio", "opt ms", "op ms");
  std::vector<VariableSpec> vars;
  for (auto bytes : kSizes) vars.push_back({var_name(bytes), bytes / sizeof(float), {}});
  std::vector<std::unique_ptr<Target>> targets;
  for (const auto& s : setups) targets.push_back(std::make_unique<Target>(s, vars));
  for (auto op : kOps)
    for (std::uint32_t v = 0; v < vars.size(); ++v)
      for (std::size_t t = 0; t < kPlainSetups; ++t) row(*targets[t], op, v, reps);
  std::printf("\n");
  for (std::size_t t = 0; t < kPlainSetups; ++t) copy_on_write_rows(*targets[t], reps);
  std::printf("\nsecurity.curve: the same client and servers with ZeroMQ CURVE, against plain tcp\n");
  std::printf("%-10s %-7s %3s  %10s  %10s  %6s  %9s\n", "op", "size", "ps", "plain GB/s",
              "curve GB/s", "ratio", "cost");
  for (auto op : kOps)
    for (std::uint32_t v = 0; v < vars.size(); ++v)
      for (std::size_t t = 0; t < kPlainSetups; ++t)
        curve_row(*targets[t], *targets[kPlainSetups + t], op, v, reps);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_ps: %s\n", e.what());
  return 1;
}
