#include "shared/shard_map.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <unordered_set>

#include "shared/config.h"

namespace pstrain {

ShardMap::ShardMap(std::vector<VariableSpec> variables, std::uint32_t servers,
                   std::uint64_t chunk_bytes)
    : variables_(std::move(variables)),
      servers_(servers),
      chunk_bytes_(chunk_bytes),
      bytes_on_(servers, 0) {
  if (servers == 0) throw std::invalid_argument("shard map: no parameter servers");
  if (chunk_bytes < sizeof(float) || chunk_bytes > kMaxChunkBytes)
    throw std::invalid_argument("shard map: chunk size " + std::to_string(chunk_bytes) +
                                " B is outside [4 B, 16 MiB]");
  std::unordered_set<std::string_view> names;
  for (const auto& v : variables_) {
    if (v.name.empty()) throw std::invalid_argument("shard map: a variable has no name");
    if (v.size == 0) throw std::invalid_argument("shard map: variable '" + v.name + "' is empty");
    if (!names.insert(v.name).second)
      throw std::invalid_argument("shard map: variable '" + v.name + "' is declared twice");
  }

  const std::uint64_t chunk_elems = chunk_bytes / sizeof(float);
  std::vector<std::vector<ChunkRef>> per_variable(variables_.size());
  auto least_loaded = [&] {
    return static_cast<std::uint32_t>(std::min_element(bytes_on_.begin(), bytes_on_.end()) -
                                      bytes_on_.begin());
  };

  // Large variables first, in declaration order, so their round-robin start
  // is deterministic and the whole-variable placement below can even out
  // what they leave.
  std::uint32_t next_server = 0;
  for (std::uint32_t vi = 0; vi < variables_.size(); ++vi) {
    const auto size = variables_[vi].size;
    if (size <= chunk_elems) continue;
    std::uint64_t n = (size + chunk_elems - 1) / chunk_elems;
    n = (n + servers - 1) / servers * servers;
    n = std::min(n, size);
    std::uint64_t offset = 0;
    for (std::uint64_t c = 0; c < n; ++c) {
      const std::uint64_t count = size / n + (c < size % n ? 1 : 0);
      per_variable[vi].push_back({vi, static_cast<std::uint32_t>(c), offset, count, next_server});
      bytes_on_[next_server] += count * sizeof(float);
      next_server = (next_server + 1) % servers;
      offset += count;
    }
  }

  std::vector<std::uint32_t> small;
  for (std::uint32_t vi = 0; vi < variables_.size(); ++vi)
    if (variables_[vi].size <= chunk_elems) small.push_back(vi);
  std::stable_sort(small.begin(), small.end(),
                   [&](auto a, auto b) { return variables_[a].size > variables_[b].size; });
  for (auto vi : small) {
    const auto server = least_loaded();
    per_variable[vi].push_back({vi, 0, 0, variables_[vi].size, server});
    bytes_on_[server] += variables_[vi].size * sizeof(float);
  }

  first_chunk_.push_back(0);
  for (auto& chunks : per_variable) {
    chunks_.insert(chunks_.end(), chunks.begin(), chunks.end());
    first_chunk_.push_back(chunks_.size());
  }
}

std::optional<std::uint32_t> ShardMap::find(std::string_view name) const {
  for (std::uint32_t i = 0; i < variables_.size(); ++i)
    if (variables_[i].name == name) return i;
  return std::nullopt;
}

std::span<const ChunkRef> ShardMap::chunks(std::uint32_t variable) const {
  if (variable >= variables_.size())
    throw std::out_of_range("shard map: no variable #" + std::to_string(variable));
  return {chunks_.data() + first_chunk_[variable],
          first_chunk_[variable + 1] - first_chunk_[variable]};
}

ShardMap shard_map_for(const ClusterConfig& config, std::vector<VariableSpec> variables) {
  return ShardMap(std::move(variables), static_cast<std::uint32_t>(config.ps.size()),
                  config.net.chunk_bytes);
}

}  // namespace pstrain
