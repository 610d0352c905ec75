#pragma once
// Mode backup: each step of a chunk collects the gradients computed on its
// current version (backup_aggregator.h) and applies their mean once it has
// the first N - b; late gradients are dropped and answered at once with the
// current values. Reads are answered at once.
//
// With replication.replicas 2 the primary's steps decide (Consistency::follows):
// each step it applies goes to its backup (ReplySink::applied_step), whose
// copy applies that mean (on_step) and only acknowledges the forwarded
// gradients; once the copy is taken over it collects steps of its own,
// counting the workers its ps's coordinator hears (Consistency::liveness).
#include <cstdint>

#include "server/consistency/backup_aggregator.h"
#include "server/consistency/policy.h"

namespace pstrain::ps {

class BackupPolicy final : public ConsistencyPolicy {
 public:
  BackupPolicy(const PolicyContext& context, const Consistency& consistency)
      : context_(context),
        liveness_(consistency.liveness ? *consistency.liveness : context.coordinator),
        follows_(consistency.follows),
        aggregator_(consistency.backup_workers),
        lr_scaling_(consistency.lr_scaling),
        accumulate_steps_(consistency.accumulate_steps) {}
  void on_pull(const Request& request, const wire::ChunkRequest& id, const Chunk& c) override;
  void on_push(const Request& request, const wire::ChunkRequest& id,
               std::span<const float> grad) override;
  void on_step(const Request& request, const wire::StepRequest& step,
               std::span<const float> mean) override;
  // Steps the workers lost or finished since complete.
  void on_tick() override;
  // Steps applied and late gradients dropped.
  void log_summary() const override;

 private:
  void apply_step(const BackupAggregator::Step& step);
  std::size_t needed() const;
  // A shard's copy whose primary decides the steps (not taken over).
  bool following() const { return follows_ && follows_(); }
  // The learning rate's factor for a step's mean of `gradients`.
  float lr_scale(std::size_t gradients) const;
  void count_held() { context_.stats.held(0, aggregator_.held()); }

  PolicyContext context_;
  const Coordinator& liveness_;  // who trains
  std::function<bool()> follows_;
  BackupAggregator aggregator_;
  bool lr_scaling_;
  std::uint32_t accumulate_steps_;
  std::uint64_t steps_applied_ = 0, gradients_dropped_ = 0;
};

}  // namespace pstrain::ps
