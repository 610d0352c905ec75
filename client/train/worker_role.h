#pragma once
// `pstrain --role worker` and `pstrain --role eval`. Each returns the process
// exit code.
#include <cstdint>
#include <filesystem>

#include "shared/config.h"

namespace pstrain {

int run_worker_role(const ClusterConfig& config, std::uint32_t index);
// Builds the configured model on the CPU for the shape of the configured
// data, without loading it, so that `pstrain --check` names a layer list's
// errors (shapes, inputs, tables, ids per sample). Throws ConfigError.
void check_model(const ClusterConfig& config);
// Prints the test accuracy of a saved model (a file written at the end of a
// run, see README "Saved model"); `config` is the model's own
// (load_model_config), which names its architecture and dataset.
int run_eval_role(const ClusterConfig& config, const std::filesystem::path& model);

}  // namespace pstrain
