#include "server/table_store.h"

#include <algorithm>
#include <stdexcept>

namespace pstrain::ps {

TableStore::TableStore(const std::vector<TableSpec>& tables, const RowOptimizerConfig& optimizer,
                       std::uint64_t seed, std::uint32_t ps_index, std::uint32_t servers)
    : seed_(seed), ps_index_(ps_index), servers_(servers) {
  for (const auto& spec : tables) tables_.push_back({spec, RowOptimizer(optimizer, spec.dim), {}});
}

const TableStore::Table& TableStore::table(std::string_view name) const {
  const auto it = std::ranges::find(tables_, name, [](const Table& t) { return t.spec.name; });
  if (it == tables_.end())
    throw std::invalid_argument("no embedding table '" + std::string(name) + "'");
  return *it;
}

TableStore::Table& TableStore::table(std::string_view name) {
  return const_cast<Table&>(std::as_const(*this).table(name));
}

const TableSpec& TableStore::spec(std::string_view name) const { return table(name).spec; }

std::size_t TableStore::rows(std::string_view name) const { return table(name).rows.size(); }

void TableStore::check_keys(std::string_view name, std::span<const std::uint64_t> keys) const {
  const TableSpec& spec = table(name).spec;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto bad = [&](const std::string& why) {
      throw std::invalid_argument("table '" + spec.name + "': id " + std::to_string(keys[i]) +
                                  " (position " + std::to_string(i) + ") " + why);
    };
    if (i > 0 && keys[i] == keys[i - 1]) bad("is repeated");
    if (i > 0 && keys[i] < keys[i - 1]) bad("is out of order (ids must be sorted)");
    if (spec.rows && keys[i] >= *spec.rows)
      bad("is not a row of the table's " + std::to_string(*spec.rows));
    if (const auto home = row_home(keys[i], servers_, seed_); home != ps_index_)
      bad("lives on ps " + std::to_string(home) + ", not this ps " + std::to_string(ps_index_));
  }
}

float* TableStore::row(Table& t, std::uint64_t key, std::uint64_t& created) {
  auto [it, fresh] = t.rows.try_emplace(key);
  if (fresh) {
    const std::size_t dim = t.spec.dim;
    it->second = std::make_unique<float[]>(dim + t.optimizer.state_floats());
    init_row({it->second.get(), dim}, seed_, t.spec, key);
    t.optimizer.init_state({it->second.get() + dim, t.optimizer.state_floats()});
    ++created;
  }
  return it->second.get();
}

TableStore::Table& TableStore::checked(std::string_view name, std::span<const std::uint64_t> keys,
                                       std::size_t floats, const char* what) {
  Table& t = table(name);
  check_keys(name, keys);
  if (floats != keys.size() * t.spec.dim)
    throw std::invalid_argument("table '" + t.spec.name + "': " + std::to_string(floats) + " " +
                                what + " for " + std::to_string(keys.size()) + " rows of " +
                                std::to_string(t.spec.dim));
  // Counted only near the cap: far from it no request can reach it.
  if (t.rows.size() + keys.size() > t.spec.max_rows_per_ps) {
    const auto fresh = std::ranges::count_if(keys, [&](auto k) { return !t.rows.contains(k); });
    if (t.rows.size() + static_cast<std::size_t>(fresh) > t.spec.max_rows_per_ps)
      throw std::invalid_argument("table '" + t.spec.name + "': this ps holds " +
                                  std::to_string(t.rows.size()) + " rows and max_rows_per_ps is " +
                                  std::to_string(t.spec.max_rows_per_ps) + "; " +
                                  std::to_string(fresh) + " new rows refused");
  }
  return t;
}

std::uint64_t TableStore::read(std::string_view name, std::span<const std::uint64_t> keys,
                               std::span<float> out) {
  Table& t = checked(name, keys, out.size(), "values");
  const std::size_t dim = t.spec.dim;
  std::uint64_t created = 0;
  for (std::size_t i = 0; i < keys.size(); ++i)
    std::copy_n(row(t, keys[i], created), dim, out.data() + i * dim);
  return created;
}

std::uint64_t TableStore::update(std::string_view name, std::span<const std::uint64_t> keys,
                                 std::span<const float> grads) {
  Table& t = checked(name, keys, grads.size(), "gradients");
  const std::size_t dim = t.spec.dim;
  std::uint64_t created = 0;
  const std::size_t state = t.optimizer.state_floats();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    float* r = row(t, keys[i], created);
    t.optimizer.update({r, dim}, {r + dim, state}, grads.subspan(i * dim, dim));
  }
  return created;
}

}  // namespace pstrain::ps
