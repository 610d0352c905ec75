#pragma once
// `pstrain --role worker` and `pstrain --role eval`. Each returns the process
// exit code.
#include <cstdint>
#include <filesystem>

#include "shared/config.h"

namespace pstrain {

int run_worker_role(const ClusterConfig& config, std::uint32_t index);
// Prints the test accuracy of a saved model (a file written at the end of a
// run, see README "Saved model"); `config` is the model's own
// (load_model_config), which names its architecture and dataset.
int run_eval_role(const ClusterConfig& config, const std::filesystem::path& model);

}  // namespace pstrain
