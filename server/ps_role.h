#pragma once
// `pstrain --role ps`: serves ps `index` of the cluster until every worker is
// done, a shutdown request arrives, SIGTERM/SIGINT, or no worker has been
// heard from for net.worker_timeout seconds (then exits non-zero naming the
// silent workers). Returns the process exit code.
#include <cstdint>
#include <filesystem>
#include <optional>

#include "shared/config.h"

namespace pstrain {

int run_ps_role(const ClusterConfig& config, std::uint32_t index,
                const std::optional<std::filesystem::path>& restore_dir);

}  // namespace pstrain
