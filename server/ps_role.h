#pragma once
// `pstrain --role ps`: serves ps `index` of the cluster until every worker is
// done, a shutdown request arrives, SIGTERM/SIGINT, or no worker has been
// heard from for net.worker_timeout seconds (then exits non-zero naming the
// silent workers). Returns the process exit code: 0 after the last `done`, a
// `shutdown` request or a signal; 3 when a worker fell silent; 75
// (ps::kExitFenced) when its backup took its shard over (replicated shards:
// a restart re-joins, so tools/launch restarts it); 2 when nothing
// was served: what `restore` names cannot be loaded (server/shard_file.h:
// `latest`, this ps's newest checkpoint, or fresh values when it has none;
// otherwise a folder holding ps<index>.bin, an end-of-run snapshot or one
// checkpoint generation) or the address cannot be bound; 1 on a network
// error while serving.
//
// With checkpoint.every_s > 0 the ps writes checkpoints while it serves and
// one more whenever it exits after serving (server/checkpointer.h).
//
// Log lines go to stderr and run_dir/ps<index>.log (the CLI opens the log). The
// stats op answers JSON (keys in server/ps_stats.h).
//
// The ps is built of: server/request_loop.h (socket, replies),
// server/dispatcher.h (decoding, checks, dispatch, resends),
// server/coordinator.h (barriers, kv store, liveness, exit policy),
// server/chunk_handlers.h (chunk ops, snapshot), server/shard_file.h (files,
// restore), server/checkpointer.h, server/ps_stats.h.
#include <cstdint>
#include <filesystem>
#include <optional>

#include "shared/config.h"

namespace pstrain {

int run_ps_role(const ClusterConfig& config, std::uint32_t index,
                const std::optional<std::filesystem::path>& restore);

}  // namespace pstrain
