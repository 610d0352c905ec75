#include "shared/embedding.h"

#include <algorithm>
#include <stdexcept>

namespace pstrain {

std::uint64_t row_key(const TableSpec& table, std::uint64_t id) {
  return table.rows ? id % *table.rows : id;
}

std::uint32_t row_home(std::uint64_t key, std::uint32_t servers, std::uint64_t seed) {
  if (servers == 0) throw std::invalid_argument("row_home: no servers");
  return static_cast<std::uint32_t>(splitmix64(key ^ splitmix64(seed)) % servers);
}

void init_row(std::span<float> out, std::uint64_t seed, const TableSpec& table, std::uint64_t key) {
  if (out.size() != table.dim)
    throw std::invalid_argument("init_row of '" + table.name + "': " + std::to_string(out.size()) +
                                " floats for a row of " + std::to_string(table.dim));
  init_fill(out, seed ^ splitmix64(key), table.name, 0, table.init);
}

UniqueRows unique_rows(const TableSpec& table, std::span<const std::uint64_t> ids) {
  UniqueRows rows;
  rows.keys.reserve(ids.size());
  for (const auto id : ids) rows.keys.push_back(row_key(table, id));
  std::ranges::sort(rows.keys);
  rows.keys.erase(std::unique(rows.keys.begin(), rows.keys.end()), rows.keys.end());
  rows.inverse.reserve(ids.size());
  for (const auto id : ids)
    rows.inverse.push_back(static_cast<std::uint32_t>(
        std::ranges::lower_bound(rows.keys, row_key(table, id)) - rows.keys.begin()));
  return rows;
}

}  // namespace pstrain
