#include "client/model/model_io.h"

#include <algorithm>
#include <sstream>

#include "client/model/model.h"
#include "shared/atomic_file.h"
#include "shared/snapshot.h"

namespace pstrain {
namespace {

std::filesystem::path yaml_beside(const std::filesystem::path& bin) {
  auto path = bin;
  return path.replace_extension(".yaml");
}

}  // namespace

void save_model(const std::filesystem::path& bin, Model& model, const ClusterConfig& config,
                std::uint64_t global_samples) {
  Snapshot snapshot;
  snapshot.global_samples = global_samples;
  const auto& vars = model.variables();
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const float* values = model.param(i).data();
    snapshot.records.push_back(
        {vars[i].name, 0, 0, std::vector<float>(values, values + vars[i].size), {}});
  }
  write_snapshot(bin, snapshot);

  std::ostringstream text;
  text << "# pstrain saved model: weights in " << bin.filename().string() << ", trained on "
       << global_samples << " samples\n"
       << config.to_yaml();
  std::istringstream layers(model.describe());
  for (std::string line; std::getline(layers, line);) text << "# " << line << "\n";
  write_file_atomically(yaml_beside(bin), text.str());
}

ClusterConfig load_model_config(const std::filesystem::path& bin,
                                const std::vector<std::string>& overrides) {
  return load_config(yaml_beside(bin), overrides);
}

void load_model_weights(const std::filesystem::path& bin, Model& model) {
  const Snapshot snapshot = read_snapshot(bin);
  const auto& vars = model.variables();
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const auto it = std::ranges::find_if(snapshot.records, [&](const SnapshotRecord& r) {
      return r.name == vars[i].name && r.chunk == 0;
    });
    if (it == snapshot.records.end())
      throw SnapshotError(bin.string() + ": no variable '" + vars[i].name + "'");
    if (it->values.size() != vars[i].size)
      throw SnapshotError(bin.string() + ": variable '" + vars[i].name + "' has " +
                          std::to_string(it->values.size()) + " values, the model expects " +
                          std::to_string(vars[i].size));
    std::ranges::copy(it->values, model.param(i).data());
  }
}

}  // namespace pstrain
