#pragma once
// `pstrain --role ps`: serves ps `index` of the cluster until every worker is
// done, a shutdown request arrives, SIGTERM/SIGINT, or no worker has been
// heard from for net.worker_timeout seconds (then exits non-zero naming the
// silent workers). Returns the process exit code: 0 after the last `done`, a
// `shutdown` request or a signal; 3 when a worker fell silent; 2 when nothing
// was served: the snapshot in `restore_dir` (its ps<index>.bin, as written by
// the snapshot op to run_dir/snapshot) cannot be loaded or the address cannot
// be bound; 1 on a network error while serving.
//
// Log lines go to stderr and run_dir/ps<index>.log (the CLI opens the log). The
// stats op answers JSON (keys in server/ps_stats.h).
//
// The ps is built of: server/request_loop.h (socket, decoding, dispatch,
// replies), server/coordinator.h (barriers, kv store, liveness, exit policy),
// server/data_handlers.h (chunk ops, snapshot, restore), server/ps_stats.h.
#include <cstdint>
#include <filesystem>
#include <optional>

#include "shared/config.h"

namespace pstrain {

int run_ps_role(const ClusterConfig& config, std::uint32_t index,
                const std::optional<std::filesystem::path>& restore_dir);

}  // namespace pstrain
