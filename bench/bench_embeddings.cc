// bench_embeddings: embedding tables on real parameter servers (forked
// children on loopback tcp; docs/embeddings.md).
//
//   bench_embeddings rows [--reps N] [--quick] [--json]
//     One ps, row optimizer adagrad. For dim 16, 64, 128 and 1k, 10k, 100k
//     unique ids per request: rows/s of sparse_pull and sparse_push through
//     PsClient (rows created beforehand, so a pull is a lookup), alternated
//     rep by rep with raw ZeroMQ DEALER->ROUTER moving the same bytes (pull:
//     the ids out, the rows back; push: the ids and gradients out, 8 B back),
//     and the ps's resident bytes per row of a million-row table against the
//     row's values and state (target: at most 1.5x). --quick: dim 16 and 64,
//     up to 10k ids.
//
//   bench_embeddings checkpoint [--rows N] [--dim D] [--seconds S]
//     One ps holding N rows (10^7 unless given) while a client pushes 10k
//     random rows back to back and another pings it (the stats op) every
//     millisecond, once without checkpoints and once checkpointing every
//     second (server/table_store.h's cuts): the longest ping is the longest
//     pause a client sees (target: <= 50 ms more than without).
//
//   bench_embeddings big [--rows N] [--servers P] [--dim D]
//     N rows (10^8 unless given) over P ps (4), filled by pushes of 100k
//     rows: the fill's rows/s, each ps's resident memory, and the time of one
//     checkpoint of everything.
//
// --json prints the rows mode's figures as JSON lines for tools/bench.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench/raw_server.h"
#include "client/ps/ps_client.h"
#include "server/ps_role.h"
#include "shared/row_optimizer.h"
#include "tests/support/child_process.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::ranges::sort(v);
  return v[v.size() / 2];
}

ClusterConfig make_config(const std::filesystem::path& run_dir, std::uint32_t servers,
                          std::uint32_t dim, double checkpoint_every_s) {
  ClusterConfig c;
  c.job = "bench";
  c.run_dir = run_dir;
  for (std::uint32_t i = 0; i < servers; ++i) {
    PsEndpoint e;
    e.port = free_port();
    c.ps.push_back(e);
  }
  c.workers.resize(1);
  TableSpec table{"emb", dim, std::nullopt};
  table.max_rows_per_ps = std::uint64_t{1} << 32;
  c.tables = {table};
  c.optimizer.sparse.kind = RowOptimizerKind::adagrad;
  c.optimizer.sparse.lr = 1e-3f;
  c.net.worker_timeout = 3600;
  c.net.request_timeout = 600;
  c.checkpoint.every_s = checkpoint_every_s;
  c.checkpoint.keep = 1;
  return c;
}

std::filesystem::path log_of(const ClusterConfig& c, std::uint32_t ps) {
  return c.run_dir.string() + "-ps" + std::to_string(ps) + ".log";
}

// A ps's figure from its stats op's JSON: the first number after "key":.
double stat(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\":");
  if (at == std::string::npos) throw std::runtime_error("stats lack " + key + ": " + json);
  return std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

// Sorted unique random keys homed on ps `home` of `servers`.
std::vector<std::uint64_t> keys_for(std::size_t n, std::uint32_t home, std::uint32_t servers,
                                    std::uint64_t seed, std::mt19937_64& rng) {
  std::vector<std::uint64_t> keys;
  while (keys.size() < n) {
    const auto k = rng();
    if (row_home(k, servers, seed) == home) keys.push_back(k);
  }
  std::ranges::sort(keys);
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

std::uint64_t rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("VmRSS:")) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// Pushes 100k-row batches of random keys (the client sends each ps its
// own) until about `rows` rows exist; returns rows/s.
double fill(PsClient& ps, std::uint64_t rows, std::uint32_t dim, std::mt19937_64& rng) {
  constexpr std::size_t kBatch = 100000;
  std::vector<float> grads(kBatch * dim, 1e-3f);
  const auto t0 = Clock::now();
  std::uint64_t done = 0;
  while (done < rows) {
    std::vector<std::uint64_t> keys(std::min<std::uint64_t>(kBatch, rows - done));
    for (auto& k : keys) k = rng();
    std::ranges::sort(keys);
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    ps.wait(ps.sparse_push("emb", keys, std::span(grads).first(keys.size() * dim)));
    done += keys.size();
  }
  return static_cast<double>(rows) / seconds_since(t0);
}

// ---- rows: ours against raw ZeroMQ.

struct RowsFigures {
  std::uint32_t dim = 0;
  std::size_t ids = 0;
  std::vector<double> pull_ours, pull_raw, push_ours, push_raw;  // rows/s per rep
};

int rows_mode(int reps, bool quick, bool json) {
  TempDir dir;
  const std::uint32_t dims_all[] = {16, 64, 128};
  const std::size_t ids_all[] = {1000, 10000, 100000};
  std::vector<ClusterConfig> configs;
  for (const auto dim : dims_all) {
    if (quick && dim > 64) continue;
    configs.push_back(make_config(dir.path() / ("d" + std::to_string(dim)), 1, dim, 0));
  }
  const std::uint16_t raw_port = free_port();
  // Every server is forked before this process creates a ZeroMQ context.
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (const auto& c : configs)
    children.push_back(std::make_unique<ChildProcess>(
        log_of(c, 0), [&c] { return run_ps_role(c, 0, std::nullopt); }));
  children.push_back(std::make_unique<ChildProcess>(dir.path() / "raw.log", [raw_port]() -> int {
    bench::raw_server(raw_port, std::size_t{64} << 20);
  }));
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::sndhwm, 0);
  raw.set(zmq::sockopt::rcvhwm, 0);
  raw.connect("tcp://127.0.0.1:" + std::to_string(raw_port));
  std::mt19937 coin(std::random_device{}());
  if (!json)
    std::printf(
        "bench_embeddings rows: 1 ps on loopback tcp, adagrad rows; rows/s median (min-max) "
        "of %d reps, ours alternated with raw ZeroMQ moving the same bytes\n\n"
        "%5s %7s | %-26s %-26s %6s | %-26s %-26s %6s\n",
        reps, "dim", "ids", "pull ours", "pull raw ZeroMQ", "ratio", "push ours", "push raw ZeroMQ",
        "ratio");
  for (const auto& config : configs) {
    const auto dim = config.tables[0].dim;
    PsClient ps(config, 0, shard_map_for(config, std::vector<VariableSpec>{}));
    ps.hello();
    std::mt19937_64 rng(dim);
    for (const auto n : ids_all) {
      if (quick && n > 10000) continue;
      const auto keys = keys_for(n, 0, 1, config.train.seed, rng);
      std::vector<float> grads(n * dim, 1e-3f), rows(n * dim);
      ps.wait(ps.sparse_push("emb", keys, grads));  // the rows exist from here on
      const int ops = static_cast<int>(std::clamp<std::size_t>(2000000 / n, 3, 200));
      const auto ours = [&](bool push) {
        const auto t0 = Clock::now();
        for (int i = 0; i < ops; ++i)
          ps.wait(push ? ps.sparse_push("emb", keys, grads) : ps.sparse_pull("emb", keys, rows));
        return n * ops / seconds_since(t0);
      };
      const auto theirs = [&](bool push) {
        const std::uint64_t reply = push ? 8 : n * dim * sizeof(float);
        const auto t0 = Clock::now();
        for (int i = 0; i < ops; ++i) {
          raw.send(zmq::buffer(&reply, sizeof reply), zmq::send_flags::sndmore);
          raw.send(
              zmq::message_t(const_cast<std::uint64_t*>(keys.data()), n * 8, [](void*, void*) {}),
              push ? zmq::send_flags::sndmore : zmq::send_flags::none);
          if (push)
            raw.send(
                zmq::message_t(grads.data(), grads.size() * sizeof(float), [](void*, void*) {}),
                zmq::send_flags::none);
          zmq::message_t msg;
          (void)raw.recv(msg);
        }
        return n * ops / seconds_since(t0);
      };
      RowsFigures f{dim, n, {}, {}, {}, {}};
      for (bool push : {false, true}) {
        auto& mine = push ? f.push_ours : f.pull_ours;
        auto& peer = push ? f.push_raw : f.pull_raw;
        (void)ours(push);
        (void)theirs(push);
        for (int r = 0; r < reps; ++r) {
          if (coin() & 1) {
            mine.push_back(ours(push));
            peer.push_back(theirs(push));
          } else {
            peer.push_back(theirs(push));
            mine.push_back(ours(push));
          }
        }
      }
      const auto spread = [](const std::vector<double>& v) {
        const auto [lo, hi] = std::ranges::minmax(v);
        char text[64];
        std::snprintf(text, sizeof text, "%.3gM (%.3g-%.3g)", median(v) / 1e6, lo / 1e6, hi / 1e6);
        return std::string(text);
      };
      if (json) {
        std::printf("{\"bench\": \"embeddings\", \"dim\": %u, \"ids\": %zu", dim, n);
        for (const auto& [key, v] :
             {std::pair{"pull_ours", &f.pull_ours}, std::pair{"pull_raw", &f.pull_raw},
              std::pair{"push_ours", &f.push_ours}, std::pair{"push_raw", &f.push_raw}}) {
          std::printf(", \"%s\": [", key);
          for (std::size_t i = 0; i < v->size(); ++i) std::printf("%s%.1f", i ? ", " : "", (*v)[i]);
          std::printf("]");
        }
        std::printf("}\n");
      } else {
        std::printf("%5u %7zu | %-26s %-26s %6.2f | %-26s %-26s %6.2f\n", dim, n,
                    spread(f.pull_ours).c_str(), spread(f.pull_raw).c_str(),
                    median(f.pull_ours) / median(f.pull_raw), spread(f.push_ours).c_str(),
                    spread(f.push_raw).c_str(), median(f.push_ours) / median(f.push_raw));
      }
    }
    // Bytes per row in a table of a million rows: the segments' last,
    // partly filled pages no longer count.
    std::mt19937_64 more(dim + 1);
    fill(ps, 1000000, dim, more);
    const auto stats = ps.stats(0);
    const double rows_held = stat(stats, "rows"), bytes = stat(stats, "bytes");
    const double own = (2.0 * dim) * sizeof(float);  // values and adagrad's accumulators
    if (json)
      std::printf(
          "{\"bench\": \"embedding_bytes\", \"dim\": %u, \"rows\": %.0f, "
          "\"bytes_per_row\": %.1f, \"own_bytes\": %.0f}\n",
          dim, rows_held, bytes / rows_held, own);
    else
      std::printf(
          "%5u resident: %.0f rows, %.1f bytes per row = %.2fx the row's values and "
          "state (%.0f bytes)\n",
          dim, rows_held, bytes / rows_held, bytes / rows_held / own, own);
  }
  return 0;
}

// ---- checkpoint: the longest pause with a large table.

int checkpoint_mode(std::uint64_t rows, std::uint32_t dim, double seconds) {
  TempDir dir;
  const ClusterConfig configs[] = {make_config(dir.path() / "off", 1, dim, 0),
                                   make_config(dir.path() / "on", 1, dim, 1)};
  std::vector<std::unique_ptr<ChildProcess>> servers;
  for (const auto& c : configs)
    servers.push_back(std::make_unique<ChildProcess>(
        log_of(c, 0), [&c] { return run_ps_role(c, 0, std::nullopt); }));
  std::printf(
      "bench_embeddings checkpoint: 1 ps, %llu rows x %u (adagrad), a client pushing 10k random "
      "rows back to back, a stats ping every 1 ms, %.0f s per run\n\n%-12s %10s %9s %8s %11s "
      "%12s %12s\n",
      static_cast<unsigned long long>(rows), dim, seconds, "checkpoints", "fill rows/s",
      "median ms", "p99 ms", "longest ms", "pushes/s", "writes (s)");
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& config = configs[i];
    PsClient load(config, 0, shard_map_for(config, std::vector<VariableSpec>{}));
    load.hello();
    std::mt19937_64 rng(7);
    const double fill_rate = fill(load, rows, dim, rng);
    std::atomic<bool> stop{false};
    std::uint64_t pushes = 0;
    std::thread loader([&] {
      std::mt19937_64 r(11);
      std::vector<float> grads(10000 * dim, 1e-3f);
      while (!stop.load()) {
        std::vector<std::uint64_t> keys(10000);
        for (auto& k : keys) k = r();
        std::ranges::sort(keys);
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        load.wait(load.sparse_push("emb", keys, std::span(grads).first(keys.size() * dim)));
        ++pushes;
      }
    });
    PsClient ping(config, 1000, shard_map_for(config, std::vector<VariableSpec>{}));
    std::vector<double> pings;
    const auto t0 = Clock::now();
    while (seconds_since(t0) < seconds) {
      const auto start = Clock::now();
      ping.stats(0);
      pings.push_back(seconds_since(start) * 1e3);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stop = true;
    loader.join();
    const double elapsed = seconds_since(t0);
    servers[i]->stop();
    std::ranges::sort(pings);
    std::ifstream in(log_of(config, 0));
    const std::regex line(R"(checkpoint \d+ of \d+ chunks written to \S+ in ([0-9.]+) s)");
    std::string writes;
    for (std::string text; std::getline(in, text);)
      if (std::smatch m; std::regex_search(text, m, line))
        writes += (writes.empty() ? "" : " ") + m[1].str();
    std::printf("%-12s %10.0f %9.2f %8.2f %11.2f %12.1f %s\n", i ? "every 1 s" : "off", fill_rate,
                pings[pings.size() / 2], pings[pings.size() * 99 / 100], pings.back(),
                static_cast<double>(pushes) / elapsed, writes.empty() ? "-" : writes.c_str());
  }
  return 0;
}

// ---- big: 10^8 rows over several ps.

int big_mode(std::uint64_t rows, std::uint32_t servers, std::uint32_t dim) {
  TempDir dir;
  const auto config = make_config(dir.path() / "big", servers, dim, 3600);
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (std::uint32_t s = 0; s < servers; ++s)
    children.push_back(std::make_unique<ChildProcess>(
        log_of(config, s), [&config, s] { return run_ps_role(config, s, std::nullopt); }));
  PsClient ps(config, 0, shard_map_for(config, std::vector<VariableSpec>{}));
  ps.hello();
  std::mt19937_64 rng(3);
  const double rate = fill(ps, rows, dim, rng);
  std::printf("bench_embeddings big: %llu rows x %u (adagrad) over %u ps, filled at %.0f rows/s\n",
              static_cast<unsigned long long>(rows), dim, servers, rate);
  double held = 0;
  for (std::uint32_t s = 0; s < servers; ++s) {
    const auto stats = ps.stats(s);
    held += stat(stats, "rows");
    std::printf("ps %u: %.0f rows, %.2f GiB counted, %.2f GiB resident\n", s, stat(stats, "rows"),
                stat(stats, "bytes") / (1 << 30),
                static_cast<double>(rss_bytes(children[s]->pid())) / (1 << 30));
  }
  // One checkpoint of everything: SIGTERM writes it on the way out.
  const auto t0 = Clock::now();
  for (auto& c : children) c->stop();
  std::printf("%.0f rows held; the exit checkpoint of all ps took %.1f s\n", held,
              seconds_since(t0));
  return 0;
}

std::uint64_t number(const char* text, const char* what) {
  double v = std::strtod(text, nullptr);
  if (v <= 0) throw std::invalid_argument(std::string(what) + " must be positive");
  return static_cast<std::uint64_t>(v);
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  int reps = 5;
  bool quick = false, json = false;
  std::uint64_t rows = 0, servers = 4, dim = 16;
  double seconds = 10;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--reps")
      reps = static_cast<int>(number(value(), "--reps"));
    else if (arg == "--quick")
      quick = true;
    else if (arg == "--json")
      json = true;
    else if (arg == "--rows")
      rows = number(value(), "--rows");
    else if (arg == "--servers")
      servers = number(value(), "--servers");
    else if (arg == "--dim")
      dim = number(value(), "--dim");
    else if (arg == "--seconds")
      seconds = static_cast<double>(number(value(), "--seconds"));
    else
      throw std::invalid_argument("unknown argument " + arg);
  }
  if (mode == "rows") return rows_mode(reps, quick, json);
  if (mode == "checkpoint")
    return checkpoint_mode(rows ? rows : 10000000, static_cast<std::uint32_t>(dim), seconds);
  if (mode == "big")
    return big_mode(rows ? rows : 100000000, static_cast<std::uint32_t>(servers),
                    static_cast<std::uint32_t>(dim));
  std::fprintf(stderr,
               "usage: bench_embeddings rows [--reps N] [--quick] [--json]\n"
               "       bench_embeddings checkpoint [--rows N] [--dim D] [--seconds S]\n"
               "       bench_embeddings big [--rows N] [--servers P] [--dim D]\n");
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_embeddings: %s\n", e.what());
  return 1;
}
