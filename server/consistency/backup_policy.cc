#include "server/consistency/backup_policy.h"

#include <stdexcept>

#include "server/chunk_replies.h"
#include "shared/log.h"

namespace pstrain::ps {

void BackupPolicy::on_pull(const Request& request, const wire::ChunkRequest&, const Chunk& c) {
  if (aggregator_.retarget(request)) return;
  reply_values(context_.sink, request, c);
}

std::size_t BackupPolicy::needed() const {
  return aggregator_.needed(liveness_.workers_training());
}

float BackupPolicy::lr_scale(std::size_t gradients) const {
  return lr_scaling_ ? static_cast<float>(gradients * accumulate_steps_) : 1.0f;
}

void BackupPolicy::on_push(const Request& request, const wire::ChunkRequest& id,
                           std::span<const float> grad) {
  const Chunk& c = existing_chunk(context_.store, id);
  if (following()) {
    // Which gradients make the step is the primary's to say (on_step); the
    // copy only holds that this one arrived, so that its record answers a
    // resend once it serves the shard.
    if (grad.size() != c.values->size())
      throw std::invalid_argument("gradient of " + std::to_string(grad.size()) +
                                  " floats, the chunk has " + std::to_string(c.values->size()));
    context_.coordinator.applied_update(request.header);
    return reply_update(context_.sink, request, c);
  }
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

void BackupPolicy::on_step(const Request& request, const wire::StepRequest& step,
                           std::span<const float> mean) {
  if (!following())
    throw std::invalid_argument("this ps decides its own steps (it serves the shard)");
  const Chunk& c = existing_chunk(context_.store, {step.variable, step.chunk});
  if (c.values->size() != mean.size())
    throw std::invalid_argument("step of " + std::to_string(mean.size()) +
                                " floats, the chunk has " + std::to_string(c.values->size()));
  if (c.version != step.base_version)
    throw CopyMissesUpdates("the copy's chunk is at version " + std::to_string(c.version) +
                            ", the primary applied this step at " +
                            std::to_string(step.base_version) + ": the copy misses updates");
  const Chunk& after = context_.store.push(step.variable, step.chunk, mean,
                                           lr_scale(static_cast<std::size_t>(step.gradients)));
  ++steps_applied_;
  reply_version(context_.sink, request, after);
}

void BackupPolicy::on_tick() {
  // Steps a taken-over copy collected before handing the shard back: its
  // primary decides again, and their senders resend there.
  if (following()) {
    if (aggregator_.held() > 0) {
      aggregator_.clear();
      count_held();
    }
    return;
  }
  const auto steps = aggregator_.take_complete(needed());
  for (const auto& step : steps) apply_step(step);
  if (!steps.empty()) count_held();
}

void BackupPolicy::apply_step(const BackupAggregator::Step& step) {
  const Chunk& c =
      context_.store.push(step.name, step.chunk, step.mean, lr_scale(step.waiting.size()));
  ++steps_applied_;
  // A copy that serves the shard has no backup to tell.
  if (!follows_)
    context_.sink.applied_step({step.name, step.chunk, c.version - 1, step.waiting.size()},
                               step.mean, step.waiting);
  for (const auto& r : step.waiting) reply_update(context_.sink, r, c);
}

void BackupPolicy::log_summary() const {
  log("mode backup: ", steps_applied_, " chunk steps applied, ", gradients_dropped_,
      " late gradients dropped");
}

}  // namespace pstrain::ps
