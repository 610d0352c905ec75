#pragma once
// Embedding tables: what a table is, which ps holds a row, and a row's
// initial values. A table has a name, a row width `dim`, and either a fixed
// number of rows (ids are taken modulo it: the hashing trick) or none
// (`dynamic`: any uint64 id). Every process computes a row's home and
// initial values alone, without asking anyone (docs/embeddings.md).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shared/init.h"

namespace pstrain {

struct TableSpec {
  std::string name;
  std::uint32_t dim = 0;
  // A fixed number of rows; nullopt: dynamic.
  std::optional<std::uint64_t> rows;
  // The most rows of the table one ps holds: a push that would create more
  // first evicts the least recently updated rows, so no peer can grow a ps
  // without bound.
  std::uint64_t max_rows_per_ps = std::uint64_t{1} << 26;
  // Pushes of an id without a row that are dropped (counted) before one
  // creates its row: rare ids never take memory (at most 254).
  std::uint32_t admit_after = 0;
  // Seconds without an update after which a row is removed; 0: never.
  double expire_after_s = 0;
  // The initial values' distribution (uniform in [-scale, scale) by default,
  // as TensorFlow's and PyTorch's embedding layers start).
  InitSpec init{InitKind::uniform, 0.05f};
};

// The row an id of `table` names: id mod rows for a fixed table, the id
// itself for a dynamic one.
std::uint64_t row_key(const TableSpec& table, std::uint64_t id);

// The ps that holds row `key` of any table, among `servers`:
// splitmix64(key ^ seed) mod servers (shared/init.h), so consecutive or
// skewed ids spread evenly and every process agrees. `seed` is the shard
// map's (ClusterConfig's train.seed), so two runs may place rows apart.
std::uint32_t row_home(std::uint64_t key, std::uint32_t servers, std::uint64_t seed);

// Row `key` of `table` as it is created on first touch: element j is
// init_value(seed ^ splitmix64(key), table.name, j, table.init), a pure
// function of (seed, table, key), the same on every ps, after a restart and
// across runs. `out` holds table.dim floats.
void init_row(std::span<float> out, std::uint64_t seed, const TableSpec& table, std::uint64_t key);

// A batch's ids as the rows they name: `keys`, the row keys sorted and
// unique (as the sparse ops want them), and for each id its row's place in
// `keys` (inverse[i]), which a backend gathers rows and sums gradients by.
struct UniqueRows {
  std::vector<std::uint64_t> keys;
  std::vector<std::uint32_t> inverse;
};
UniqueRows unique_rows(const TableSpec& table, std::span<const std::uint64_t> ids);

}  // namespace pstrain
