// bench_checkpoint: does a checkpoint stop a ps from serving? One real ps
// (a forked child on loopback tcp) holds a 256 MiB store (64 variables of
// 4 MiB, SGD) while a client pushes and pulls them back to back and a second
// client pings the ps (the stats op) every millisecond. The same load runs
// twice, against a ps with checkpoints off and one checkpointing every
// `every_s` (server/checkpointer.h); the longest ping is the longest pause
// of the ps's request loop as a client sees it (target: <= 50 ms more than
// without checkpoints). The checkpoints' write times come from the ps's log.
//
//   bench_checkpoint [seconds per run = 10] [every_s = 1]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <regex>
#include <thread>

#include "client/ps/ps_client.h"
#include "server/ps_role.h"
#include "tests/support/child_process.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kVariables = 64, kFloats = 1 << 20;  // 64 x 4 MiB = 256 MiB

ClusterConfig make_config(const std::filesystem::path& run_dir, double every_s) {
  ClusterConfig c;
  c.job = "bench";
  c.run_dir = run_dir;
  PsEndpoint e;
  e.port = free_port();
  c.ps.push_back(e);
  c.workers.resize(1);
  c.optimizer.kind = OptimizerKind::sgd;
  c.optimizer.lr = 1e-6f;
  c.net.chunk_bytes = 1 << 20;
  c.net.worker_timeout = 3600;
  c.checkpoint.every_s = every_s;
  c.checkpoint.keep = 2;
  return c;
}

std::vector<VariableSpec> variables() {
  std::vector<VariableSpec> v;
  for (std::size_t i = 0; i < kVariables; ++i)
    v.push_back({"v" + std::to_string(i), kFloats, {InitKind::uniform, 1.0f}});
  return v;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Figures {
  double longest_ping_ms = 0, median_ping_ms = 0, p99_ping_ms = 0, longest_pair_ms = 0;
  std::uint64_t pings = 0, requests = 0;
  std::vector<double> write_s;  // each checkpoint's write, from the ps log
};

// The write times the ps logged ("checkpoint N of M chunks written to F in S s").
std::vector<double> checkpoint_writes(const std::filesystem::path& log) {
  std::ifstream in(log);
  const std::regex line(R"(checkpoint \d+ of \d+ chunks written to \S+ in ([0-9.]+) s)");
  std::vector<double> out;
  for (std::string text; std::getline(in, text);)
    if (std::smatch m; std::regex_search(text, m, line)) out.push_back(std::stod(m[1]));
  return out;
}

std::filesystem::path log_of(const ClusterConfig& config) {
  return config.run_dir.string() + ".log";
}

Figures measure(const ClusterConfig& config, ChildProcess& server,
                std::chrono::duration<double> length) {
  const auto map = shard_map_for(config, variables());
  PsClient load(config, 0, map);
  load.hello();
  load.init(1);
  Figures f;
  std::atomic<bool> stop{false};
  std::thread loader([&] {
    const std::vector<float> grad(kFloats, 1.0f);
    std::vector<float> out(kFloats);
    for (std::size_t i = 0; !stop.load(); ++i) {
      const auto start = Clock::now();
      load.wait(load.push("v" + std::to_string(i % kVariables), grad));
      load.wait(load.pull("v" + std::to_string((i + kVariables / 2) % kVariables), out));
      f.longest_pair_ms = std::max(f.longest_pair_ms, ms(Clock::now() - start));
      f.requests += 2;
    }
  });
  PsClient ping(config, 1000, map);
  std::vector<double> pings;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(length);
  while (Clock::now() < end) {
    const auto start = Clock::now();
    ping.stats(0);
    pings.push_back(ms(Clock::now() - start));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  loader.join();
  server.stop();  // SIGTERM: the ps writes its last checkpoint and exits
  std::ranges::sort(pings);
  f.pings = pings.size();
  f.median_ping_ms = pings[pings.size() / 2];
  f.p99_ping_ms = pings[pings.size() * 99 / 100];
  f.longest_ping_ms = pings.back();
  f.write_s = checkpoint_writes(log_of(config));
  return f;
}

}  // namespace

int main(int argc, char** argv) try {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 10;
  const double every_s = argc > 2 ? std::atof(argv[2]) : 1;
  if (seconds <= 0 || every_s <= 0) {
    std::fprintf(stderr, "usage: bench_checkpoint [seconds > 0] [every_s > 0]\n");
    return 2;
  }
  TempDir dir;
  const ClusterConfig configs[] = {make_config(dir.path() / "off", 0),
                                   make_config(dir.path() / "on", every_s)};
  // Servers are forked before this process creates a ZeroMQ context.
  std::vector<std::unique_ptr<ChildProcess>> servers;
  for (const auto& c : configs)
    servers.push_back(std::make_unique<ChildProcess>(
        log_of(c), [&c] { return run_ps_role(c, 0, std::nullopt); }));

  std::printf(
      "bench_checkpoint: 1 ps on loopback tcp, 256 MiB store (64 x 4 MiB, 1 MiB chunks, "
      "SGD), a client pushing and pulling 4 MiB back to back, a stats ping every 1 ms; "
      "%.0f s per run\n\n",
      seconds);
  std::printf("%-14s %8s %10s %8s %11s %17s %11s %15s\n", "checkpoints", "pings", "median ms",
              "p99 ms", "longest ms", "push+pull max ms", "requests/s", "writes (max s)");
  for (std::size_t i = 0; i < 2; ++i) {
    const auto f = measure(configs[i], *servers[i], std::chrono::duration<double>(seconds));
    const auto label =
        i == 0 ? std::string("off") : "every " + std::to_string(every_s).substr(0, 4) + " s";
    const double longest_write = f.write_s.empty() ? 0 : *std::ranges::max_element(f.write_s);
    std::printf("%-14s %8llu %10.2f %8.2f %11.2f %17.2f %11.1f %8zu (%.2f)\n", label.c_str(),
                static_cast<unsigned long long>(f.pings), f.median_ping_ms, f.p99_ping_ms,
                f.longest_ping_ms, f.longest_pair_ms, f.requests / seconds, f.write_s.size(),
                longest_write);
  }
  std::printf("\nwrites counts the checkpoints logged, the one on exit included.\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
  return 1;
}
