#include "server/checkpointer.h"

#include <algorithm>
#include <cstdio>

#include <sys/resource.h>
#include <unistd.h>

#include "shared/log.h"

namespace pstrain::ps {
namespace {

// The writer thread's nice value: about a tenth of the CPU share of the
// request loop when both want a core.
constexpr int kWriterNice = 10;

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options, std::function<ShardCut()> cut,
                           Clock::time_point start)
    : options_(std::move(options)),
      cut_(std::move(cut)),
      due_(start + std::chrono::duration_cast<Clock::duration>(options_.every)) {
  const auto seqs = generations(options_.checkpoints);
  next_seq_ = seqs.empty() ? 1 : seqs.back() + 1;
}

Checkpointer::~Checkpointer() { join(); }

void Checkpointer::tick(Clock::time_point now) {
  if (now < due_ || writing_.load(std::memory_order_acquire)) return;
  // Due again a period after this one starts, so a write that takes longer
  // than the period is followed at once by the next, never overlapped.
  due_ = now + std::chrono::duration_cast<Clock::duration>(options_.every);
  start();
}

void Checkpointer::finish() {
  join();
  start();
  join();
}

void Checkpointer::start() {
  join();  // the previous writer has finished (or this is the last word)
  writing_.store(true, std::memory_order_relaxed);
  writer_ = std::thread([this, seq = next_seq_++, cut = cut_()]() mutable {
    // Serving comes first: on a busy host the CRC and the write of a large
    // shard would otherwise take CPU time from the request loop (Linux
    // applies a thread id's nice value to that thread alone). Best effort:
    // a refusal leaves the writer at the ps's priority.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNice);
    write(seq, cut);
    cut.chunks.clear();  // let go of the buffers before saying so
    writing_.store(false, std::memory_order_release);
  });
}

// The writer ends when its file is written or the write failed; there is no
// way to abandon it earlier short of exiting the process.
void Checkpointer::join() {
  if (writer_.joinable()) writer_.join();
}

void Checkpointer::write(std::uint64_t seq, const ShardCut& cut) const {
  const auto file = shard_file(generation_dir(options_.checkpoints, seq), options_.ps_index);
  const auto start = Clock::now();
  try {
    write_shard(file, cut);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (options_.written) options_.written(took);
    char seconds[16];
    std::snprintf(seconds, sizeof seconds, "%.3f", took);
    log("checkpoint ", seq, " of ", cut.chunks.size(), " chunks written to ", file.string(), " in ",
        seconds, " s");
    prune();
  } catch (const std::exception& e) {
    // The ps serves on; the previous generations are still there.
    log("checkpoint ", seq, " failed: ", e.what());
  }
}

void Checkpointer::prune() const {
  std::vector<std::uint64_t> ours;
  for (const auto seq : generations(options_.checkpoints))
    if (std::filesystem::exists(
            shard_file(generation_dir(options_.checkpoints, seq), options_.ps_index)))
      ours.push_back(seq);
  if (ours.size() <= options_.keep) return;
  for (auto it = ours.begin(); it != ours.end() - options_.keep; ++it) {
    const auto dir = generation_dir(options_.checkpoints, *it);
    std::error_code ec;
    std::filesystem::remove(shard_file(dir, options_.ps_index), ec);
    // Fails, as it should, while another server's file is still there.
    std::filesystem::remove(dir, ec);
  }
}

}  // namespace pstrain::ps
