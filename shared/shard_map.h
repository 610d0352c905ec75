#pragma once
// Placement of variables on parameter servers.
//
// The map is a pure function of (ordered variables with their sizes, number of
// servers, chunk size), so every process computes the same map without asking
// anyone. Variables larger than the chunk size are cut into equal chunks,
// their count rounded up to a multiple of the number of servers and dealt
// round-robin, so one big tensor is served by every ps at once. Smaller
// variables are placed whole, largest first, on the server holding the fewest
// bytes. No chunk exceeds kMaxChunkBytes, the frame size above which ZeroMQ's
// loopback throughput collapses.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shared/init.h"

namespace pstrain {

struct ClusterConfig;

struct VariableSpec {
  std::string name;
  std::uint64_t size = 0;  // float32 elements
  InitSpec init;
};

struct ChunkRef {
  std::uint32_t variable = 0;  // index into ShardMap::variables()
  std::uint32_t index = 0;     // chunk number within the variable
  std::uint64_t offset = 0;    // first element within the variable
  std::uint64_t count = 0;     // elements
  std::uint32_t server = 0;    // ps index
};

class ShardMap {
 public:
  static constexpr std::uint64_t kDefaultChunkBytes = 256 * 1024;
  static constexpr std::uint64_t kMaxChunkBytes = 16 * 1024 * 1024;

  // Throws std::invalid_argument for zero servers, empty or duplicate
  // variable names, empty variables, or a chunk size outside [4 B, 16 MiB].
  ShardMap(std::vector<VariableSpec> variables, std::uint32_t servers,
           std::uint64_t chunk_bytes = kDefaultChunkBytes);

  std::uint32_t servers() const { return servers_; }
  std::uint64_t chunk_bytes() const { return chunk_bytes_; }
  const std::vector<VariableSpec>& variables() const { return variables_; }
  std::optional<std::uint32_t> find(std::string_view name) const;

  // Chunks of one variable, in element order.
  std::span<const ChunkRef> chunks(std::uint32_t variable) const;
  // Every chunk, grouped by variable.
  const std::vector<ChunkRef>& all_chunks() const { return chunks_; }
  std::uint64_t bytes_on(std::uint32_t server) const { return bytes_on_.at(server); }

 private:
  std::vector<VariableSpec> variables_;
  std::uint32_t servers_;
  std::uint64_t chunk_bytes_;
  std::vector<ChunkRef> chunks_;
  std::vector<std::size_t> first_chunk_;  // per variable, plus one past the end
  std::vector<std::uint64_t> bytes_on_;
};

// The map of a run: `variables` over the config's parameter servers in
// chunks of its net.chunk_bytes. Every process that talks to the servers
// builds it this way, so they all agree.
ShardMap shard_map_for(const ClusterConfig& config, std::vector<VariableSpec> variables);

}  // namespace pstrain
