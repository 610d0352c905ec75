#pragma once
// A table's rows as a cut writes them (server/table_store.h), by key, for
// tests that compare two stores or a store against a file.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "shared/snapshot.h"

namespace pstrain::testing {

// One row: its values then its optimizer state, its clock and second.
struct Row {
  std::vector<float> floats;
  std::uint64_t clock = 0;
  std::uint32_t second = 0;
  bool operator==(const Row&) const = default;
};

inline std::map<std::uint64_t, Row> rows_of(const TableSnapshotView& view) {
  std::map<std::uint64_t, Row> out;
  const auto n = view.header.row_floats();
  view.rows([&](const TableRows& b) {
    for (std::size_t i = 0; i < b.keys.size(); ++i)
      out[b.keys[i]] = {{b.floats.begin() + static_cast<std::ptrdiff_t>(i * n),
                         b.floats.begin() + static_cast<std::ptrdiff_t>((i + 1) * n)},
                        b.clocks[i],
                        b.seconds[i]};
  });
  return out;
}

}  // namespace pstrain::testing
