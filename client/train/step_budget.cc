#include "client/train/step_budget.h"

#include <algorithm>
#include <cmath>

namespace pstrain {

std::uint64_t total_steps(const ClusterConfig& config, const WorkerShard& shard) {
  const auto batches = shard.batches_per_epoch(config.train.batch_size);
  return static_cast<std::uint64_t>(std::ceil(config.train.epochs * static_cast<double>(batches)));
}

std::uint64_t optimizer_steps(const ClusterConfig& config, const WorkerShard& shard) {
  const std::uint64_t k = config.train.accumulate_steps;
  return (total_steps(config, shard) + k - 1) / k;
}

std::uint32_t micro_batches(const ClusterConfig& config, const WorkerShard& shard,
                            std::uint64_t step) {
  const std::uint64_t k = config.train.accumulate_steps;
  return static_cast<std::uint32_t>(std::min(k, total_steps(config, shard) - step * k));
}

std::uint64_t steps_for_samples(const WorkerShard& shard, std::uint64_t samples,
                                std::size_t batch_size) {
  const std::uint64_t per_epoch = shard.size();
  return samples / per_epoch * shard.batches_per_epoch(batch_size) +
         samples % per_epoch / batch_size;
}

}  // namespace pstrain
