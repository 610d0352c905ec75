#pragma once
// The saved model: <name>.bin holds every variable as one record of the
// snapshot format (shared/snapshot.h: values, no optimizer state) and
// <name>.yaml beside it the resolved configuration of the run that trained
// it, whose `model` key rebuilds the architecture, followed by the layers as
// comments for a reader.
#include <filesystem>

#include "shared/config.h"

namespace pstrain {

class Model;

// Writes `bin` and its .yaml atomically; the model's parameters must be
// readable by the host (a CPU replica, as the evaluator holds).
void save_model(const std::filesystem::path& bin, Model& model, const ClusterConfig& config,
                std::uint64_t global_samples);

// The configuration saved beside `bin`, with `overrides` applied as on the
// command line; throws ConfigError naming the file.
ClusterConfig load_model_config(const std::filesystem::path& bin,
                                const std::vector<std::string>& overrides = {});

// Fills `model`'s parameters from `bin`; throws SnapshotError when a
// variable is missing or its size differs, naming both.
void load_model_weights(const std::filesystem::path& bin, Model& model);

}  // namespace pstrain
