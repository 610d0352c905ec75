#include "server/consistency/backup_policy.h"

#include "server/chunk_replies.h"
#include "shared/log.h"

namespace pstrain::ps {

void BackupPolicy::on_pull(const Request& request, const wire::ChunkRequest&, const Chunk& c) {
  if (aggregator_.retarget(request)) return;
  reply_values(context_.sink, request, c);
}

std::size_t BackupPolicy::needed() const {
  return aggregator_.needed(context_.coordinator.workers_training());
}

void BackupPolicy::on_push(const Request& request, const wire::ChunkRequest& id,
                           std::span<const float> grad) {
  const Chunk& c = existing_chunk(context_.store, id);
  const auto wanted = needed();
  const auto verdict = aggregator_.add(request, id.variable, id.chunk, c.version, grad, wanted);
  // Acknowledged, whether applied with its step or dropped: what the
  // sender counts (PsClient::acked_updates, compared after a restore).
  context_.coordinator.applied_update(request.header);
  if (verdict == BackupAggregator::Verdict::late) {
    context_.stats.gradient_dropped();
    ++gradients_dropped_;
    return reply_update(context_.sink, request, c);
  }
  context_.sink.accepted(request.header, c.version);
  if (auto step = aggregator_.take_if_complete(id.variable, id.chunk, wanted)) apply_step(*step);
  count_held();
}

void BackupPolicy::on_tick() {
  const auto steps = aggregator_.take_complete(needed());
  for (const auto& step : steps) apply_step(step);
  if (!steps.empty()) count_held();
}

void BackupPolicy::apply_step(const BackupAggregator::Step& step) {
  const float lr_scale =
      lr_scaling_ ? static_cast<float>(step.waiting.size() * accumulate_steps_) : 1.0f;
  const Chunk& c = context_.store.push(step.name, step.chunk, step.mean, lr_scale);
  ++steps_applied_;
  for (const auto& r : step.waiting) reply_update(context_.sink, r, c);
}

void BackupPolicy::log_summary() const {
  log("mode backup: ", steps_applied_, " chunk steps applied, ", gradients_dropped_,
      " late gradients dropped");
}

}  // namespace pstrain::ps
