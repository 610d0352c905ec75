#pragma once
// How many steps a worker takes and where a restarted one resumes: batches
// of train.batch_size in train.epochs passes over its shard, grouped into
// optimizer steps of train.accumulate_steps micro-batches.
#include <cstddef>
#include <cstdint>

#include "client/data/dataset.h"
#include "shared/config.h"

namespace pstrain {

// Batches of train.batch_size in `config.train.epochs` passes over the shard,
// rounded up. Every worker of a run gets the same number (shards are equal).
std::uint64_t total_steps(const ClusterConfig& config, const WorkerShard& shard);
// Optimizer steps of a run: total_steps' batches in groups of
// train.accumulate_steps micro-batches, the last group possibly shorter.
std::uint64_t optimizer_steps(const ClusterConfig& config, const WorkerShard& shard);
// The micro-batches of optimizer step `step` (0-based).
std::uint32_t micro_batches(const ClusterConfig& config, const WorkerShard& shard,
                            std::uint64_t step);
// The whole steps behind `samples` of a worker's samples: epochs end in a
// shorter batch (WorkerShard::next_batch), and a partly counted batch is
// done again. Where a restarted worker resumes (WorkerShard::seek).
std::uint64_t steps_for_samples(const WorkerShard& shard, std::uint64_t samples,
                                std::size_t batch_size);

}  // namespace pstrain
