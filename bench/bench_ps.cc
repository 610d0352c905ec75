// bench_ps: push, pull and push_pull through PsClient against real parameter
// servers (forked children on loopback tcp), alternated rep by rep with raw
// ZeroMQ DEALER->ROUTER moving the same bytes in the same chunks:
//   push: SIZE out, 8 B ack;  pull: 8 B out, SIZE back;  push_pull: SIZE both ways
// GB/s counts SIZE for push and pull and 2 x SIZE for push_pull. Our pull
// (and push_pull) includes copying the values into the caller's buffer; the
// raw peer only receives them into ZeroMQ messages. The ps runs SGD; the time
// it spends in the optimizer (from its stats) is reported per operation.
// Each row runs one untimed rep of both sides first (connections, first
// touch of the buffers), then 7 reps, each side first at random; median, min
// and max.
//
// Then a memcpy of each size in this process: the memory's bandwidth, the
// limit no transport passes.
//
// Then the same operations with security.curve (ZeroMQ CURVE: encryption and
// the ps's key check) against the plain client, alternated the same way, with
// the throughput of each and their ratio.
//
//   bench_ps [--chunk-bytes N] [--reps N] [--max-bytes N] [--json]
// --max-bytes leaves out the larger sizes; --json prints the ours-vs-raw rows
// as JSON objects (every rep's GB/s) for tools/bench, and nothing else.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench/raw_server.h"
#include "client/ps/ps_client.h"
#include "server/ps_role.h"
#include "tests/support/child_process.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr std::uint64_t kSizes[] = {4 * kKiB, 64 * kKiB, kMiB, 16 * kMiB, 64 * kMiB};
enum class Op { push, pull, push_pull };
constexpr Op kOps[] = {Op::push, Op::pull, Op::push_pull};
const char* name(Op op) { return op == Op::push ? "push" : op == Op::pull ? "pull" : "push_pull"; }

std::string size_name(std::uint64_t bytes) {
  return bytes >= kMiB ? std::to_string(bytes / kMiB) + " MiB"
                       : std::to_string(bytes / kKiB) + " KiB";
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

// Runs `a` and `b` (each returning seconds per operation) once untimed, then
// `reps` times each, which goes first drawn at random per rep, so neither
// side always finds the caches, the ps or the loopback as the other left them.
std::pair<std::vector<double>, std::vector<double>> alternate(int reps,
                                                              const std::function<double()>& a,
                                                              const std::function<double()>& b) {
  static std::mt19937 rng(std::random_device{}());
  (void)a();
  (void)b();
  std::vector<double> as, bs;
  for (int r = 0; r < reps; ++r) {
    if (rng() & 1) {
      as.push_back(a());
      bs.push_back(b());
    } else {
      bs.push_back(b());
      as.push_back(a());
    }
  }
  return {as, bs};
}

// "median (min-max)" of the throughput `moved` bytes at each of `seconds`.
std::string gbs_spread(double moved, const std::vector<double>& seconds) {
  const auto [fast, slow] = std::minmax_element(seconds.begin(), seconds.end());
  char text[64];
  std::snprintf(text, sizeof text, "%.3f (%.3f-%.3f)", moved / median(seconds) / 1e9,
                moved / *slow / 1e9, moved / *fast / 1e9);
  return text;
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

void row(Target& t, Op op, std::uint32_t v, int reps, bool json) {
  const auto bytes = kSizes[v];
  const int n = ops_per_rep(bytes);
  std::vector<float> grad(bytes / sizeof(float), 1e-3f), out(grad.size());
  auto& ps = t.ps;
  const auto raw = [&] {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) t.raw.run(op, t.map, v, grad);
    return std::chrono::duration<double>(Clock::now() - t0).count() / n;
  };
  const double opt_before = stats_sum(ps, t.servers, "optimizer_seconds");
  const auto [ours, theirs] = alternate(
      reps, [&] { return time_ours(t, op, v, n, grad, out); }, raw);
  // The warm-up rep's updates count too: reps + 1 reps of ours ran.
  const double opt_ms = (stats_sum(ps, t.servers, "optimizer_seconds") - opt_before) * 1e3 /
                        (static_cast<double>(reps + 1) * n);
  const double moved = moved_bytes(op, v);
  if (json) {
    std::printf(
        "{\"bench\": \"ps\", \"op\": \"%s\", \"bytes\": %llu, \"servers\": %u, "
        "\"opt_ms\": %.4f",
        name(op), static_cast<unsigned long long>(bytes), t.servers, op == Op::pull ? 0.0 : opt_ms);
    for (const auto& [key, seconds] :
         {std::pair{"ours_gbs", &ours}, std::pair{"raw_gbs", &theirs}}) {
      std::printf(", \"%s\": [", key);
      for (std::size_t i = 0; i < seconds->size(); ++i)
        std::printf("%s%.4f", i ? ", " : "", moved / (*seconds)[i] / 1e9);
      std::printf("]");
    }
    std::printf("}\n");
  } else {
    std::printf("%-10s %-7s %3u  %-22s  %-22s  %6.2f  %8.3f  %9.3f\n", name(op),
                size_name(bytes).c_str(), t.servers, gbs_spread(moved, ours).c_str(),
                gbs_spread(moved, theirs).c_str(), median(theirs) / median(ours),
                op == Op::pull ? 0.0 : opt_ms, median(ours) * 1e3);
  }
  std::fflush(stdout);
}

// The same operation through a plain and a CURVE cluster, alternated rep by rep.
// The limit beside the rows: a memcpy of the same bytes between two buffers
// of this process (in cache up to 64 KiB, from memory above), one untimed
// rep then `reps`, as GB/s.
void memcpy_row(std::uint32_t v, int reps, bool json) {
  const auto bytes = kSizes[v];
  const int n = ops_per_rep(bytes);
  // Page-aligned, as large buffers are: glibc's memcpy on some CPUs (AMD
  // Zen's `rep movsb`) is many times slower between buffers whose distance
  // is a little over a multiple of 4 KiB, as adjacent heap blocks are.
  const auto page_aligned = [bytes] {
    return std::unique_ptr<char, decltype(&std::free)>(
        static_cast<char*>(std::aligned_alloc(4096, bytes)), &std::free);
  };
  const auto from_buffer = page_aligned(), to_buffer = page_aligned();
  const std::span<char> from(from_buffer.get(), bytes), to(to_buffer.get(), bytes);
  std::ranges::fill(from, 1);
  std::ranges::fill(to, 0);
  std::vector<double> seconds;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      from[static_cast<std::size_t>(i) % bytes] = static_cast<char>(i);  // not hoisted out
      std::memcpy(to.data(), from.data(), bytes);
      // The copy's destination counts as read: not a dead store to drop.
      asm volatile("" : : "r"(to.data()) : "memory");
    }
    if (r > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / n);
  }
  const double moved = static_cast<double>(bytes);
  if (json) {
    std::printf("{\"bench\": \"memcpy\", \"bytes\": %llu, \"gbs\": [",
                static_cast<unsigned long long>(bytes));
    for (std::size_t i = 0; i < seconds.size(); ++i)
      std::printf("%s%.4f", i ? ", " : "", moved / seconds[i] / 1e9);
    std::printf("]}\n");
  } else {
    std::printf("%-10s %-7s %3s  %-22s\n", "memcpy", size_name(bytes).c_str(), "-",
                gbs_spread(moved, seconds).c_str());
  }
  std::fflush(stdout);
}

void curve_row(Target& plain, Target& curve, Op op, std::uint32_t v, int reps) {
  const int n = ops_per_rep(kSizes[v]);
  std::vector<float> grad(kSizes[v] / sizeof(float), 1e-3f), out(grad.size());
  const auto [plain_s, curve_s] = alternate(
      reps, [&] { return time_ours(plain, op, v, n, grad, out); },
      [&] { return time_ours(curve, op, v, n, grad, out); });
  const double moved = moved_bytes(op, v);
  std::printf("%-10s %-7s %3u  %-22s  %-22s  %6.2f  %8.1fx\n", name(op),
              size_name(kSizes[v]).c_str(), plain.servers, gbs_spread(moved, plain_s).c_str(),
              gbs_spread(moved, curve_s).c_str(), median(plain_s) / median(curve_s),
              median(curve_s) / median(plain_s));
  std::fflush(stdout);
}

void copy_on_write_rows(Target& t, int reps, std::uint64_t max_bytes) {
  auto& ps = t.ps;
  const auto servers = t.servers;
  // Copy-on-write: a push queued right behind a pull of the same chunks finds
  // the pull's buffers still on their way out and must copy them; one issued
  // after the pull completed updates in place.
  for (const auto bytes : {kMiB, 16 * kMiB}) {
    if (bytes > max_bytes) continue;
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
    throw std::invalid_argument(std::string(flag) + ": expected a positive integer, got '" + text +
                                "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t chunk_bytes = ShardMap::kDefaultChunkBytes,
                max_bytes = kSizes[std::size(kSizes) - 1];
  int reps = 7;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--chunk-bytes" || arg == "--reps" || arg == "--max-bytes") && i + 1 < argc) {
      const auto v = parse_arg(argv[++i], arg.c_str());
      if (arg == "--reps")
        reps = static_cast<int>(v);
      else if (arg == "--max-bytes")
        max_bytes = v;
      else
        chunk_bytes = v;
    } else if (arg == "--json") {
      json = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_ps [--chunk-bytes N] [--reps N] [--max-bytes N] [--json]\n");
      return 2;
    }
  }
  const std::uint32_t sizes = static_cast<std::uint32_t>(
      std::upper_bound(std::begin(kSizes), std::end(kSizes), max_bytes) - std::begin(kSizes));
  if (sizes == 0) throw std::invalid_argument("--max-bytes: below the smallest size, 4 KiB");
  TempDir dir;
  std::vector<Setup> setups = {make_setup(1, chunk_bytes, dir.path()),
                               make_setup(2, chunk_bytes, dir.path())};
  constexpr std::size_t kPlainSetups = 2;  // then the same with CURVE, unless --json
  if (!json) {
    setups.push_back(make_setup(1, chunk_bytes, dir.path(), true));
    setups.push_back(make_setup(2, chunk_bytes, dir.path(), true));
  }
  // Every server is forked before this process creates a ZeroMQ context.
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (const auto& s : setups)
    for (std::uint32_t i = 0; i < s.config.ps.size(); ++i) {
      const auto log = dir.path() / "servers.log";
      children.push_back(std::make_unique<ChildProcess>(
          log, [&, i] { return run_ps_role(s.config, i, std::nullopt); }));
      children.push_back(std::make_unique<ChildProcess>(
          log, [&, i]() -> int { bench::raw_server(s.raw_ports[i], ShardMap::kMaxChunkBytes); }));
    }

  if (!json) {
    std::printf(
        "bench_ps: loopback tcp, 1 client, chunk size %s, SGD on the ps, 1 warm-up rep,\n"
        "then %d reps in random order per rep; GB/s as median (min-max)\n",
        size_name(chunk_bytes).c_str(), reps);
    std::printf(
        "raw = ZeroMQ DEALER->ROUTER with the same chunks in flight; push_pull counts 2 x size;\n"
        "our pull includes the copy into the caller's buffer, raw's does not\n\n");
    std::printf("%-10s %-7s %3s  %-22s  %-22s  %6s  %8s  %9s\n", "op", "size", "ps", "ours GB/s",
                "raw GB/s", "ratio", "opt ms", "op ms");
  }
  std::vector<VariableSpec> vars;
  for (std::uint32_t v = 0; v < sizes; ++v)
    vars.push_back({var_name(kSizes[v]), kSizes[v] / sizeof(float), {}});
  std::vector<std::unique_ptr<Target>> targets;
  for (const auto& s : setups) targets.push_back(std::make_unique<Target>(s, vars));
  for (auto op : kOps)
    for (std::uint32_t v = 0; v < vars.size(); ++v)
      for (std::size_t t = 0; t < kPlainSetups; ++t) row(*targets[t], op, v, reps, json);
  for (std::uint32_t v = 0; v < vars.size(); ++v) memcpy_row(v, reps, json);
  if (json) return 0;
  std::printf("\n");
  for (std::size_t t = 0; t < kPlainSetups; ++t) copy_on_write_rows(*targets[t], reps, max_bytes);
  std::printf(
      "\nsecurity.curve: the same client and servers with ZeroMQ CURVE, against plain tcp\n");
  std::printf("%-10s %-7s %3s  %-22s  %-22s  %6s  %9s\n", "op", "size", "ps", "plain GB/s",
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
