#include "client/train/backend_setup.h"

#include <algorithm>

#include "client/model/model.h"
#include "shared/log.h"

namespace pstrain {

Precision apply_precision(Backend& backend, Precision wanted) {
  Precision used = wanted;
  if (const std::string why = backend.precision_unavailable(wanted); !why.empty()) {
    used = Precision::fp32;
    log("train.precision=", to_string(wanted), " is not available on ", backend.name(), ": ", why,
        "; training in ", to_string(used));
  }
  backend.set_precision(used);
  return used;
}

bool scales_loss(const ClusterConfig& config, const Backend& backend) {
  return config.train.precision == Precision::fp16 &&
         backend.precision_unavailable(Precision::fp16).empty();
}

std::string describe_paths(const PathCounts& paths) {
  std::string text;
  for (const auto& [path, count] : paths)
    text += (text.empty() ? "" : ", ") + path + " " + std::to_string(count);
  return text.empty() ? "none counted" : text;
}

bool records_steps(const ClusterConfig& config, const Backend& backend) {
  // Embedding layers: a batch's unique rows, and so the shapes of their
  // lookups, change from step to step, which a replay cannot follow.
  const auto layers = model_layers(config.model);
  const bool embeddings = std::ranges::any_of(layers, [](const ModelLayer& l) {
    return l.type == "embedding" || l.type == "embedding_bag";
  });
  return config.train.cuda_graphs && backend.records_steps() &&
         config.train.precision == Precision::fp32 && config.train.accumulate_steps == 1 &&
         !embeddings;
}

int recorded_batch(const ClusterConfig& config, const Backend& backend) {
  return records_steps(config, backend) ? static_cast<int>(config.train.batch_size) : 0;
}

}  // namespace pstrain
