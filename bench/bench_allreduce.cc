// bench_allreduce: 2 workers (forked processes on 127.0.0.1, Gloo over TCP,
// rendezvous through a file store) measure
//  1. the all-reduce of 4 KiB .. 64 MiB of floats: median time of the reps
//     and the algorithm bandwidth (bytes / time);
//  2. the sync-mode step of the mlp and cnn presets (CPU backend, 1 thread,
//     synthetic data) split into compute, all-reduce and the part of it left
//     after backward, with buckets reduced after backward or on the
//     communication thread during it; samples/s counts both workers.
//
//   bench_allreduce [--json] [--steps-only] [steps=200] [batch=64] [bucket_bytes=262144]
// --json prints one JSON object per row instead of the tables (for
// tools/bench, which runs PyTorch DDP beside it); --steps-only skips part 1.
#include <sys/wait.h>
#include <unistd.h>

#include <gloo/rendezvous/file_store.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/comm/gloo_communicator.h"
#include "client/compute/cpu/cpu_backend.h"
#include "client/data/dataset.h"
#include "client/model/model.h"
#include "client/train/sync_replica.h"
#include "tests/support/child_process.h"

using namespace pstrain;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool g_json = false;

void bench_sizes(GlooCommunicator& comm) {
  if (comm.rank() == 0 && !g_json)
    std::printf("%10s %8s %12s %10s\n", "bytes", "reps", "median ms", "GB/s");
  for (std::size_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    const int reps = bytes <= (1u << 20) ? 50 : bytes <= (16u << 20) ? 11 : 5;
    std::vector<double> times;
    comm.allreduce_sum(data.data(), data.size());  // warm-up
    for (int r = 0; r < reps; ++r) {
      comm.barrier();
      const auto t = Clock::now();
      comm.allreduce_sum(data.data(), data.size());
      times.push_back(ms(Clock::now() - t));
    }
    const double m = median(times);
    if (comm.rank() == 0 && g_json)
      std::printf(
          "{\"bench\": \"allreduce\", \"bytes\": %zu, \"median_ms\": %.4f, "
          "\"min_ms\": %.4f, \"max_ms\": %.4f}\n",
          bytes, m, *std::min_element(times.begin(), times.end()),
          *std::max_element(times.begin(), times.end()));
    else if (comm.rank() == 0)
      std::printf("%10zu %8d %12.3f %10.2f\n", bytes, reps, m, bytes / (m * 1e6));
  }
}

void bench_steps(GlooCommunicator& comm, int steps, int batch, std::size_t bucket_bytes) {
  const Dataset data = make_synthetic(4096, true);
  if (comm.rank() == 0 && !g_json)
    std::printf("\n%-5s %-9s %8s %11s %13s %9s %12s %14s\n", "model", "buckets", "count",
                "compute ms", "allreduce ms", "wait ms", "overlap %", "samples/s (2)");
  for (const char* preset : {"mlp", "cnn"}) {
    for (const bool overlap : {false, true}) {
      auto backend = make_cpu_backend(1);
      WorkerShard shard(data, static_cast<std::uint32_t>(comm.rank()), 2, 1);
      ModelConfig mc;
      mc.preset = preset;
      Model model(mc, *backend, InputShape{data.channels, data.height, data.width}, data.classes,
                  batch);
      model.initialize(1);
      OptimizerConfig sgd;
      SyncReplica replica(*backend, model, comm, sgd, bucket_bytes, overlap);
      const int n = std::string(preset) == "cnn" ? std::max(steps / 8, 20) : steps;
      SyncStepTimes sum;
      Clock::time_point start;
      for (int s = -5; s < n; ++s) {
        if (s == 0) {
          comm.barrier();
          sum = {};
          start = Clock::now();
        }
        const Batch b = shard.next_batch(batch, model.input_buffer(), model.label_buffer());
        const auto t = replica.step(static_cast<int>(b.size), 1);
        sum.compute_ms += t.compute_ms;
        sum.allreduce_ms += t.allreduce_ms;
        sum.wait_ms += t.wait_ms;
      }
      const double seconds = ms(Clock::now() - start) / 1000;
      if (comm.rank() == 0 && g_json)
        std::printf(
            "{\"bench\": \"sync_step\", \"model\": \"%s\", \"buckets\": \"%s\", "
            "\"batch\": %d, \"steps\": %d, \"samples_per_s\": %.1f}\n",
            preset, overlap ? "overlap" : "after", batch, n, 2.0 * batch * n / seconds);
      else if (comm.rank() == 0)
        std::printf("%-5s %-9s %8zu %11.3f %13.3f %9.3f %12.1f %14.0f\n", preset,
                    overlap ? "overlap" : "after", replica.buckets(), sum.compute_ms / n,
                    sum.allreduce_ms / n, sum.wait_ms / n,
                    100 * (1 - sum.wait_ms / sum.allreduce_ms), 2.0 * batch * n / seconds);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool sizes = true;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json")
      g_json = true;
    else if (arg == "--steps-only")
      sizes = false;
    else
      positional.push_back(arg);
  }
  auto arg = [&](std::size_t i) { return i < positional.size() ? positional[i].c_str() : nullptr; };
  const int steps = arg(0) ? std::atoi(arg(0)) : 200;
  const int batch = arg(1) ? std::atoi(arg(1)) : 64;
  const std::size_t bucket_bytes = arg(2) ? std::strtoull(arg(2), nullptr, 10) : 256u << 10;
  if (steps < 1 || batch < 1 || bucket_bytes < 1 || positional.size() > 3) {
    std::fprintf(stderr,
                 "usage: bench_allreduce [--json] [--steps-only] [steps>=1] [batch>=1] "
                 "[bucket_bytes>=1]\n");
    return 2;
  }
  TempDir dir;
  if (!g_json) std::printf("Gloo all-reduce, 2 processes on 127.0.0.1 (ring, TCP)\n");
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) return 1;
    if (pid > 0) {
      children.push_back(pid);
      continue;
    }
    try {
      GlooOptions options;
      options.rank = rank;
      options.hosts = {"127.0.0.1", "127.0.0.1"};
      GlooCommunicator comm(options,
                            std::make_shared<gloo::rendezvous::FileStore>(dir.path().string()));
      if (sizes) bench_sizes(comm);
      bench_steps(comm, steps, batch, bucket_bytes);
      std::fflush(stdout);
      ::_exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      ::_exit(1);
    }
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return failed == 0 ? 0 : 1;
}
