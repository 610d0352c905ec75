#include "server/ps_role.h"

#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/data_handlers.h"
#include "server/ps_stats.h"
#include "server/request_loop.h"
#include "shared/log.h"
#include "shared/snapshot.h"

namespace pstrain {

int run_ps_role(const ClusterConfig& config, std::uint32_t index,
                const std::optional<std::filesystem::path>& restore_dir) {
  if (index >= config.ps.size()) {
    log("no ps ", index, " in the cluster (it has ", config.ps.size(), ")");
    return 2;
  }
  const auto address = config.ps[index].bind_address();
  MetricsRegistry metrics;
  ps::PsStats stats(metrics, index);
  ps::RequestLoop loop({index, config.hash(), config.to_yaml(), address}, stats);
  ChunkStore store(config.optimizer);
  ps::Coordinator coordinator({"ps " + std::to_string(index),
                               static_cast<std::uint32_t>(config.workers.size()),
                               std::chrono::duration<double>(config.net.worker_timeout),
                               config.train.on_worker_loss},
                              loop);
  ps::DataHandlers data(store, coordinator, loop, config.run_dir, index);
  coordinator.add_handlers(loop.handlers());
  data.add_handlers(loop.handlers());
  stats.add_handler(loop.handlers(), loop, store, coordinator);
  try {
    if (restore_dir)
      coordinator.restore_global_samples(
          ps::restore_snapshot(store, *restore_dir, index, config.ps.size()));
    loop.bind();
  } catch (const SnapshotError& e) {
    log("cannot restore: ", e.what());
    return 2;
  } catch (const ps::NetworkError& e) {
    log(e.what());
    return 2;
  }
  log("serving on ", address, " (", config.workers.size(), " workers, optimizer ",
      to_string(config.optimizer.kind), ")");
  try {
    return loop.run(coordinator);
  } catch (const ps::NetworkError& e) {
    log(e.what());
    return 1;
  }
}

}  // namespace pstrain
