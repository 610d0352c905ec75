#include "client/train/batch_feeder.h"

#include <cstdint>

#include "client/model/model.h"

namespace pstrain {

BatchFeeder::BatchFeeder(Backend& backend, Model& model, WorkerShard& shard, std::size_t batch_size)
    : backend_(backend),
      model_(model),
      shard_(shard),
      batch_size_(batch_size),
      direct_(backend.host_accessible()),
      losses_(model.loss_buffer()) {
  for (auto& s : staged_) s.ids.resize(batch_size * shard.data().ids_per_sample);
  if (direct_) return;
  const std::size_t sample_floats = shard.data().sample_floats();
  for (auto& s : staged_) {
    s.images = backend.alloc_host(batch_size * sample_floats * sizeof(float));
    s.labels = backend.alloc_host(batch_size * sizeof(std::int32_t));
  }
  host_loss_ = backend.alloc_host(batch_size * sizeof(float));
  losses_ = host_loss_.data();
}

Batch BatchFeeder::load() {
  if (direct_) {
    Staged& s = staged_[0];
    s.batch =
        shard_.next_batch(batch_size_, model_.input_buffer(), model_.label_buffer(), s.ids.data());
    last_ = s.batch.size;
    loaded_ = &s;
    return s.batch;
  }
  Staged& s = staged_[next_];
  if (!s.ready) {
    s.batch = shard_.next_batch(batch_size_, s.images.data(), s.labels.data<std::int32_t>(),
                                s.ids.data());
  }
  loaded_ = &s;
  // The other buffer's upload was issued a step ago and has completed (every
  // step ends with a fence), so stage_next may refill it now.
  s.ready = false;
  next_ ^= 1;
  last_ = s.batch.size;
  if (const std::size_t floats = shard_.data().sample_floats(); floats > 0)
    backend_.upload(s.images.data(), model_.input_buffer(), s.batch.size * floats * sizeof(float));
  backend_.upload(s.labels.data(), model_.label_buffer(), s.batch.size * sizeof(std::int32_t));
  return s.batch;
}

void BatchFeeder::stage_next() {
  if (direct_) return;
  Staged& s = staged_[next_];
  if (s.ready) return;
  s.batch =
      shard_.next_batch(batch_size_, s.images.data(), s.labels.data<std::int32_t>(), s.ids.data());
  s.ready = true;
}

std::span<const std::uint64_t> BatchFeeder::ids() const {
  if (!loaded_) return {};
  return std::span(loaded_->ids).first(loaded_->batch.size * shard_.data().ids_per_sample);
}

void BatchFeeder::fetch_losses() {
  if (!direct_) backend_.download(model_.loss_buffer(), host_loss_.data(), last_ * sizeof(float));
}

double BatchFeeder::mean_loss() const {
  double loss = 0;
  for (std::size_t s = 0; s < last_; ++s) loss += losses_[s];
  return loss / static_cast<double>(last_);
}

}  // namespace pstrain
