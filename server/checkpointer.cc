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

Checkpointer::Checkpointer(CheckpointerOptions options, Cut cut, Clock::time_point start)
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
  const bool delta = options_.incremental && written_ != 0 && deltas_ + 1 < options_.full_every;
  deltas_ = delta ? deltas_ + 1 : 0;
  const auto seq = next_seq_++;
  const auto dir = generation_dir(options_.checkpoints, seq);
  const auto file = delta ? delta_file(dir, options_.ps_index) : shard_file(dir, options_.ps_index);
  auto cut =
      cut_(delta ? CutKind::checkpoint_delta : CutKind::checkpoint_whole, delta ? written_ : 0);
  written_ = 0;  // until the writer says otherwise
  writing_.store(true, std::memory_order_relaxed);
  writer_ = std::thread([this, seq, file, cut = std::move(cut)]() mutable {
    // Serving comes first: on a busy host the CRC and the write of a large
    // shard would otherwise take CPU time from the request loop (Linux
    // applies a thread id's nice value to that thread alone). Best effort:
    // a refusal leaves the writer at the ps's priority.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNice);
    if (write(file, seq, cut)) written_ = seq;
    cut.chunks.clear();  // let go of the buffers and table segments before saying so
    cut.tables = TableCut();
    writing_.store(false, std::memory_order_release);
  });
}

// The writer ends when its file is written or the write failed; there is no
// way to abandon it earlier short of exiting the process.
void Checkpointer::join() {
  if (writer_.joinable()) writer_.join();
}

bool Checkpointer::write(const std::filesystem::path& file, std::uint64_t seq,
                         const ShardCut& cut) const {
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
    return true;
  } catch (const std::exception& e) {
    // The ps serves on; the previous generations are still there, and the
    // next checkpoint is whole.
    log("checkpoint ", seq, " failed: ", e.what());
    return false;
  }
}

void Checkpointer::prune() const {
  struct Ours {
    std::uint64_t seq;
    bool whole;
  };
  std::vector<Ours> ours;
  std::error_code ec;
  for (const auto seq : generations(options_.checkpoints)) {
    const auto dir = generation_dir(options_.checkpoints, seq);
    if (std::filesystem::exists(shard_file(dir, options_.ps_index), ec))
      ours.push_back({seq, true});
    else if (std::filesystem::exists(delta_file(dir, options_.ps_index), ec))
      ours.push_back({seq, false});
  }
  if (ours.size() <= options_.keep) return;
  // The oldest generation kept, and back to the whole file it continues.
  auto first_kept = ours.end() - options_.keep;
  while (first_kept != ours.begin() && !first_kept->whole) --first_kept;
  for (auto it = ours.begin(); it != first_kept; ++it) {
    const auto dir = generation_dir(options_.checkpoints, it->seq);
    std::filesystem::remove(shard_file(dir, options_.ps_index), ec);
    std::filesystem::remove(delta_file(dir, options_.ps_index), ec);
    // Fails, as it should, while another server's file is still there.
    std::filesystem::remove(dir, ec);
  }
}

}  // namespace pstrain::ps
