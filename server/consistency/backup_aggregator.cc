#include "server/consistency/backup_aggregator.h"

#include <algorithm>
#include <stdexcept>

#include "shared/messages.h"

namespace pstrain::ps {

std::size_t BackupAggregator::needed(std::size_t training) const {
  return training > backup_ ? training - backup_ : 1;
}

BackupAggregator::Verdict BackupAggregator::add(const Request& push, std::string_view name,
                                                std::uint32_t chunk, std::uint64_t version,
                                                std::span<const float> grad, std::size_t needed) {
  const auto base = wire::ChunkRequest::read(push.header).base_version;
  if (base < version) return Verdict::late;
  auto it = steps_.find(Key{std::string(name), chunk});
  if (it == steps_.end())
    it = steps_.emplace(Key{std::string(name), chunk}, Collecting{version, {}, {}}).first;
  Collecting& c = it->second;
  for (const auto& held : c.waiting)
    if (held.header.sender == push.header.sender) return Verdict::late;
  if (c.sum.empty()) {
    c.sum.assign(grad.begin(), grad.end());
  } else if (c.sum.size() != grad.size()) {
    throw std::invalid_argument("gradient of " + std::to_string(grad.size()) +
                                " floats, the chunk has " + std::to_string(c.sum.size()));
  } else {
    for (std::size_t i = 0; i < grad.size(); ++i) c.sum[i] += grad[i];
  }
  Request kept = push;
  kept.payload = {};
  c.waiting.push_back(std::move(kept));
  return c.waiting.size() >= needed ? Verdict::complete : Verdict::collecting;
}

BackupAggregator::Step BackupAggregator::finish(const Key& key, Collecting& c) {
  Step step{std::get<0>(key), std::get<1>(key), std::move(c.sum), std::move(c.waiting)};
  const float scale = 1.0f / static_cast<float>(step.waiting.size());
  for (float& v : step.mean) v *= scale;
  return step;
}

std::optional<BackupAggregator::Step> BackupAggregator::take_if_complete(std::string_view name,
                                                                         std::uint32_t chunk,
                                                                         std::size_t needed) {
  const auto it = steps_.find(Key{std::string(name), chunk});
  if (it == steps_.end() || it->second.waiting.size() < needed) return std::nullopt;
  Step step = finish(it->first, it->second);
  steps_.erase(it);
  return step;
}

std::vector<BackupAggregator::Step> BackupAggregator::take_complete(std::size_t needed) {
  std::vector<Step> out;
  for (auto it = steps_.begin(); it != steps_.end();) {
    if (it->second.waiting.size() < needed) {
      ++it;
      continue;
    }
    out.push_back(finish(it->first, it->second));
    it = steps_.erase(it);
  }
  return out;
}

bool BackupAggregator::retarget(const Request& resend) {
  for (auto& [_, c] : steps_) {
    for (auto& held : c.waiting) {
      if (!repeats(resend, held)) continue;
      held.from = resend.from;
      return true;
    }
  }
  return false;
}

std::size_t BackupAggregator::held() const {
  std::size_t n = 0;
  for (const auto& [_, c] : steps_) n += c.waiting.size();
  return n;
}

}  // namespace pstrain::ps
