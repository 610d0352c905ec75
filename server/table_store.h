#pragma once
// The ps's embedding tables (docs/embeddings.md): the rows of each table
// that live on this ps (shared/embedding.h, row_home), keyed by row key.
//
// Each table's rows are an absl::flat_hash_map (Abseil, Debian's
// libabsl-dev): an open-addressing Swiss table that probes one-byte tags
// with SIMD, costs about one byte per slot beyond the entry, and is kept by
// the team that serves Google's own lookups with it; std::unordered_map
// would add a node allocation and a pointer chase per row. An entry is the
// row key and one allocation holding the row's values and its optimizer
// state side by side, so a touched row is one cache-friendly block.
//
// A row is created on first touch (a pull or a push of its key) with
// init_row's values and the row optimizer's initial state: the same on
// every ps, after a restart and across runs, so no init round is needed.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shared/embedding.h"
#include "shared/row_optimizer.h"

namespace pstrain::ps {

class TableStore {
 public:
  // `tables`: every table of the run; this ps holds the rows
  // row_home(key, servers, seed) puts on `ps_index`.
  TableStore(const std::vector<TableSpec>& tables, const RowOptimizerConfig& optimizer,
             std::uint64_t seed, std::uint32_t ps_index, std::uint32_t servers);

  // The table named `name`; throws std::invalid_argument when there is
  // none.
  const TableSpec& spec(std::string_view name) const;
  // Throws std::invalid_argument naming the table and the first bad key
  // unless `keys` are sorted, unique, rows of the table (below `rows:` for
  // a fixed one) and homed on this ps.
  void check_keys(std::string_view table, std::span<const std::uint64_t> keys) const;
  // Copies the rows of `keys` (checked) into `out`, keys.size() x dim,
  // creating those that do not exist; returns how many it created.
  std::uint64_t read(std::string_view table, std::span<const std::uint64_t> keys,
                     std::span<float> out);
  // Applies `grads` (keys.size() x dim, finite) to the rows of `keys`
  // (checked) with the table's row optimizer, creating those that do not
  // exist; returns how many it created.
  std::uint64_t update(std::string_view table, std::span<const std::uint64_t> keys,
                       std::span<const float> grads);
  // Rows of `table` this ps holds.
  std::size_t rows(std::string_view table) const;

 private:
  struct Table {
    TableSpec spec;
    RowOptimizer optimizer;
    // Values (dim floats), then the optimizer's state.
    absl::flat_hash_map<std::uint64_t, std::unique_ptr<float[]>> rows;
  };
  Table& table(std::string_view name);
  const Table& table(std::string_view name) const;
  // The table, once `keys` are checked, `floats` (of `what`) is one row's
  // worth per key and the rows `keys` would create fit within the table's
  // max_rows_per_ps; else throws std::invalid_argument.
  Table& checked(std::string_view name, std::span<const std::uint64_t> keys, std::size_t floats,
                 const char* what);
  // Row `key`'s entry, created when missing (`created` counts it).
  float* row(Table& t, std::uint64_t key, std::uint64_t& created);

  std::vector<Table> tables_;
  std::uint64_t seed_;
  std::uint32_t ps_index_;
  std::uint32_t servers_;
};

}  // namespace pstrain::ps
