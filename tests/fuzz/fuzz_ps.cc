// Fuzz target: the ps's request handling in-process. The modules
// server/ps_role.cc wires (coordinator, chunk handlers, stats) serve behind
// the dispatcher the request loop uses (server/dispatcher.h), with a sink
// that encodes every reply, as the loop's socket side does, instead of
// sending it. Each input is a fresh ps fed a sequence of messages (format in
// fuzz_input.h) with ticks in between, like the loop's. A ps must answer
// anything without crashing: an exception out of the dispatcher, a crash or
// a sanitizer report is a finding.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "server/chunk_handlers.h"
#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/dispatcher.h"
#include "server/ps_stats.h"
#include "server/sparse_handlers.h"
#include "server/table_store.h"
#include "shared/config.h"
#include "shared/metrics_registry.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace pstrain;

// Stands for the request loop's wire side: encoding is where an oversized
// reply would be refused, so it happens here too.
struct EncodingSink final : ps::ReplySink {
  void send(const ps::Peer&, ps::Reply reply) override { wire::encode_header(reply.header); }
};

// Where snapshots go: a folder of this process's, removed at exit.
struct RunDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("pstrain-fuzz-" + std::to_string(::getpid()));
  ~RunDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

const RunDir run_dir;
const std::string config_yaml = ClusterConfig{}.to_yaml();

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ChunkStore store(OptimizerConfig{.kind = OptimizerKind::adam});
  MetricsRegistry metrics;
  ps::PsStats stats(metrics, 0);
  EncodingSink wire_sink;
  ps::Dispatcher dispatcher({.ps_index = 0,
                             .run_id = fuzz::kPsRunId,
                             .config_yaml = config_yaml,
                             .rights = std::nullopt,
                             .replica_of = std::nullopt},
                            stats, wire_sink);
  ps::Coordinator coordinator(
      {"ps 0", fuzz::kPsWorkers, std::chrono::seconds(1), WorkerLoss::continue_}, dispatcher);
  // One table of the one ps: every id is homed here. Its rows are capped
  // and admitted after a push, so that eviction and admission run too.
  TableSpec emb{"emb", 2, std::nullopt};
  emb.max_rows_per_ps = 64;
  emb.admit_after = 1;
  ps::TableStore tables({emb}, RowOptimizerConfig{}, {.seed = 1});
  const ps::Shard shard{store, tables, coordinator, fuzz::kPsRunId};
  ps::ChunkHandlers handlers(store, coordinator, dispatcher, stats,
                             ps::shard_file(run_dir.path / "snapshot", 0),
                             [&shard] { return ps::cut_shard(shard, ps::CutKind::snapshot); });
  ps::SparseHandlers sparse(tables, coordinator, dispatcher, stats);
  coordinator.add_handlers(dispatcher.handlers());
  handlers.add_handlers(dispatcher.handlers());
  sparse.add_handlers(dispatcher.handlers());
  stats.add_handler(dispatcher.handlers(), dispatcher, store, tables, coordinator);

  auto now = ps::Clock::time_point{} + std::chrono::hours(1);
  coordinator.start(now);
  const std::string identity = "fuzz-peer";
  std::vector<ps::Frame> frames;
  fuzz::Bytes in(data, size), frame;
  while (!in.empty() && !coordinator.exit_code()) {
    const std::uint8_t control = in[0];
    in = in.subspan(1);
    now += std::chrono::milliseconds(control >> 2);
    frames.assign(1, {reinterpret_cast<const std::uint8_t*>(identity.data()), identity.size()});
    for (int i = 0; i < (control & 3) && fuzz::take_frame(in, frame); ++i) frames.push_back(frame);
    dispatcher.handle(coordinator, frames, now);
    coordinator.tick(now);
    handlers.tick();
  }
  handlers.finish();
  return 0;
}
