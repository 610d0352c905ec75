// Shard map properties over random variable sets: complete and disjoint
// ownership, chunk size limits, balance, and determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "shared/config.h"
#include "shared/shard_map.h"

using namespace pstrain;

namespace {

std::vector<VariableSpec> random_variables(std::mt19937_64& rng, std::uint64_t chunk_elems) {
  std::vector<VariableSpec> vars(1 + rng() % 12);
  for (std::size_t i = 0; i < vars.size(); ++i) {
    vars[i].name = "v" + std::to_string(i);
    // Mix tiny, around-the-chunk and many-chunk sizes.
    switch (rng() % 3) {
      case 0:
        vars[i].size = 1 + rng() % 64;
        break;
      case 1:
        vars[i].size = 1 + rng() % (2 * chunk_elems);
        break;
      default:
        vars[i].size = 1 + rng() % (20 * chunk_elems);
        break;
    }
  }
  return vars;
}

void check_properties(const ShardMap& map) {
  const std::uint64_t chunk_elems = map.chunk_bytes() / sizeof(float);
  std::vector<std::uint64_t> load(map.servers(), 0);
  std::uint64_t largest_small = 0;
  for (std::uint32_t v = 0; v < map.variables().size(); ++v) {
    const auto& var = map.variables()[v];
    std::uint64_t next = 0;
    std::vector<std::uint32_t> indices;
    for (const auto& c : map.chunks(v)) {
      CHECK(c.variable == v);
      CHECK(c.offset == next);  // contiguous, no gap, no overlap
      CHECK(c.count > 0);
      CHECK(c.count * sizeof(float) <= map.chunk_bytes());
      CHECK(c.count * sizeof(float) <= ShardMap::kMaxChunkBytes);
      CHECK(c.server < map.servers());
      indices.push_back(c.index);
      load[c.server] += c.count * sizeof(float);
      next += c.count;
    }
    CHECK(next == var.size);  // every element owned exactly once
    for (std::uint32_t i = 0; i < indices.size(); ++i) CHECK(indices[i] == i);
    if (var.size <= chunk_elems) largest_small = std::max(largest_small, var.size * 4);
  }
  for (std::uint32_t s = 0; s < map.servers(); ++s) CHECK(load[s] == map.bytes_on(s));
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  CHECK(*hi - *lo <= std::max(map.chunk_bytes(), largest_small));
}

}  // namespace

TEST_CASE("shard map: random variable sets keep every property") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::uint32_t servers = 1 + rng() % 5;
    const std::uint64_t chunk_bytes = 4 * (1 + rng() % 4096);
    const auto vars = random_variables(rng, chunk_bytes / 4);
    const ShardMap map(vars, servers, chunk_bytes);
    check_properties(map);
    // Identical input, identical map.
    const ShardMap again(vars, servers, chunk_bytes);
    REQUIRE(again.all_chunks().size() == map.all_chunks().size());
    for (std::size_t i = 0; i < map.all_chunks().size(); ++i) {
      const auto& a = map.all_chunks()[i];
      const auto& b = again.all_chunks()[i];
      CHECK((a.variable == b.variable && a.index == b.index && a.offset == b.offset &&
             a.count == b.count && a.server == b.server));
    }
  }
}

TEST_CASE("shard map: a large variable is spread over every server") {
  const ShardMap map({{"big", 10 * 1024 * 1024, {}}}, 3, 1 << 20);
  const auto chunks = map.chunks(0);
  CHECK(chunks.size() % 3 == 0);
  for (std::uint32_t s = 0; s < 3; ++s)
    CHECK(std::ranges::count(chunks, s, &ChunkRef::server) == std::ssize(chunks) / 3);
}

TEST_CASE("shard map: the 16 MiB chunk limit and bad input") {
  const ShardMap map({{"w", 20 * 1024 * 1024, {}}}, 1, ShardMap::kMaxChunkBytes);
  for (const auto& c : map.all_chunks()) CHECK(c.count * 4 <= ShardMap::kMaxChunkBytes);
  CHECK_THROWS_AS(ShardMap({{"w", 1, {}}}, 0), std::invalid_argument);
  CHECK_THROWS_AS(ShardMap({{"w", 1, {}}}, 1, ShardMap::kMaxChunkBytes + 4), std::invalid_argument);
  CHECK_THROWS_AS(ShardMap({{"w", 1, {}}}, 1, 2), std::invalid_argument);
  CHECK_THROWS_AS(ShardMap({{"w", 0, {}}}, 1), std::invalid_argument);
  CHECK_THROWS_AS(ShardMap({{"", 1, {}}}, 1), std::invalid_argument);
  CHECK_THROWS_AS(ShardMap({{"w", 1, {}}, {"w", 2, {}}}, 1), std::invalid_argument);
  CHECK(map.find("w") == 0u);
  CHECK(!map.find("x"));
}

TEST_CASE("shard map: a run's map has the config's servers and chunk size") {
  ClusterConfig config;
  CHECK(config.net.chunk_bytes == ShardMap::kDefaultChunkBytes);
  config.ps.resize(3);
  config.net.chunk_bytes = 1024;
  const ShardMap map = shard_map_for(config, {{"w", 1000, {}}});
  CHECK(map.servers() == 3);
  CHECK(map.chunk_bytes() == 1024);
  CHECK(map.chunks(0).size() ==
        6);  // 4000 bytes: 4 chunks of 1 KiB, rounded up to a multiple of 3 servers
}
