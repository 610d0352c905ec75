// Embedding tables' arithmetic: where a row lives, its initial values, and
// each row optimizer against a double-precision reference on a hand-worked
// sequence of sparse updates (a row that is not touched keeps its values
// and state, lazy Adam's step count included).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <vector>

#include "shared/embedding.h"
#include "shared/row_optimizer.h"

using namespace pstrain;

TEST_CASE("embedding: rows spread evenly over the servers, by a seeded hash") {
  constexpr std::uint32_t kServers = 3;
  std::array<int, kServers> count{};
  for (std::uint64_t id = 0; id < 30000; ++id) ++count[row_home(id, kServers, 7)];
  for (int c : count) CHECK(std::abs(c - 10000) < 500);
  // Not id mod P: consecutive ids do not simply take turns.
  int turns = 0;
  for (std::uint64_t id = 0; id < 300; ++id) turns += row_home(id, kServers, 7) == id % kServers;
  CHECK(turns < 150);
  // Every process computes the same home; another seed places rows apart.
  int moved = 0;
  for (std::uint64_t id = 0; id < 300; ++id) {
    CHECK(row_home(id, kServers, 7) == row_home(id, kServers, 7));
    moved += row_home(id, kServers, 7) != row_home(id, kServers, 8);
  }
  CHECK(moved > 100);
  CHECK_THROWS_AS(row_home(1, 0, 7), std::invalid_argument);
}

TEST_CASE("embedding: fixed tables take ids modulo their rows, dynamic ones as they are") {
  TableSpec fixed{"t", 4, 1000};
  TableSpec dynamic{"t", 4, std::nullopt};
  CHECK(row_key(fixed, 123456789) == 789);
  CHECK(row_key(dynamic, 123456789) == 123456789);
  CHECK(row_key(dynamic, ~0ULL) == ~0ULL);
}

TEST_CASE("embedding: a row's initial values are a function of seed, table and row alone") {
  TableSpec t{"user", 8, std::nullopt};
  std::vector<float> a(8), b(8), other_row(8), other_table(8), other_seed(8);
  init_row(a, 42, t, 1u << 20);
  init_row(b, 42, t, 1u << 20);
  init_row(other_row, 42, t, (1u << 20) + 1);
  init_row(other_table, 42, TableSpec{"item", 8, std::nullopt}, 1u << 20);
  init_row(other_seed, 43, t, 1u << 20);
  CHECK(a == b);
  CHECK(a != other_row);
  CHECK(a != other_table);
  CHECK(a != other_seed);
  for (float x : a) CHECK(std::abs(x) <= t.init.scale);
  std::vector<float> wrong(7);
  CHECK_THROWS_AS(init_row(wrong, 42, t, 1), std::invalid_argument);
}

namespace {

// Three steps on rows 0 and 1 of dim 3; row 1 sits out step 2.
constexpr int kDim = 3;
const std::vector<std::map<int, std::array<double, kDim>>> kUpdates = {
    {{0, {0.5, -1.0, 2.0}}, {1, {1.0, 1.0, -0.25}}},
    {{0, {-0.75, 0.5, 1.5}}},
    {{0, {0.1, 0.2, -3.0}}, {1, {-2.0, 0.5, 0.125}}},
};
const std::array<std::array<double, kDim>, 2> kStart = {{{0.1, -0.2, 0.3}, {-0.4, 0.5, 0.6}}};

// The reference: each kind's update in double, per row, touched rows only.
std::array<std::array<double, kDim>, 2> reference(const RowOptimizerConfig& c) {
  auto w = kStart;
  std::array<std::array<double, 2 * kDim>, 2> s{};  // per element state
  std::array<double, 2> row_acc{c.initial_accumulator, c.initial_accumulator};
  std::array<int, 2> t{};
  for (auto& row : s)
    for (int j = 0; j < kDim; ++j)
      row[j] = c.kind == RowOptimizerKind::adagrad ? c.initial_accumulator : 0.0;
  for (const auto& step : kUpdates) {
    for (const auto& [r, g] : step) {
      auto& x = w[r];
      switch (c.kind) {
        case RowOptimizerKind::sgd:
          for (int j = 0; j < kDim; ++j) x[j] -= c.lr * g[j];
          break;
        case RowOptimizerKind::adagrad:
          for (int j = 0; j < kDim; ++j) {
            s[r][j] += g[j] * g[j];
            x[j] -= c.lr * g[j] / (std::sqrt(s[r][j]) + c.eps);
          }
          break;
        case RowOptimizerKind::rowwise_adagrad: {
          double sq = 0;
          for (int j = 0; j < kDim; ++j) sq += g[j] * g[j];
          row_acc[r] += sq / kDim;
          for (int j = 0; j < kDim; ++j) x[j] -= c.lr * g[j] / (std::sqrt(row_acc[r]) + c.eps);
          break;
        }
        case RowOptimizerKind::lazy_adam: {
          ++t[r];
          for (int j = 0; j < kDim; ++j) {
            double& m = s[r][j];
            double& v = s[r][kDim + j];
            m = c.beta1 * m + (1 - c.beta1) * g[j];
            v = c.beta2 * v + (1 - c.beta2) * g[j] * g[j];
            const double mh = m / (1 - std::pow(double(c.beta1), t[r]));
            const double vh = v / (1 - std::pow(double(c.beta2), t[r]));
            x[j] -= c.lr * mh / (std::sqrt(vh) + c.eps);
          }
          break;
        }
        case RowOptimizerKind::ftrl:
          for (int j = 0; j < kDim; ++j) {
            double& z = s[r][j];
            double& n = s[r][kDim + j];
            const double sigma = (std::sqrt(n + g[j] * g[j]) - std::sqrt(n)) / c.lr;
            z += g[j] - sigma * x[j];
            n += g[j] * g[j];
            x[j] = std::abs(z) <= c.l1 ? 0.0
                                       : -(z - std::copysign(double(c.l1), z)) /
                                             ((c.ftrl_beta + std::sqrt(n)) / c.lr + c.l2);
          }
          break;
      }
    }
  }
  return w;
}

}  // namespace

TEST_CASE("row optimizers: each kind equals the double reference on sparse updates") {
  std::vector<RowOptimizerConfig> configs;
  for (auto kind :
       {RowOptimizerKind::sgd, RowOptimizerKind::adagrad, RowOptimizerKind::rowwise_adagrad,
        RowOptimizerKind::lazy_adam, RowOptimizerKind::ftrl}) {
    RowOptimizerConfig c;
    c.kind = kind;
    c.lr = 0.1f;
    c.initial_accumulator = 0.1f;
    c.l1 = kind == RowOptimizerKind::ftrl ? 0.05f : 0.0f;
    c.l2 = kind == RowOptimizerKind::ftrl ? 0.5f : 0.0f;
    configs.push_back(c);
  }
  for (const auto& c : configs) {
    CAPTURE(to_string(c.kind));
    const RowOptimizer opt(c, kDim);
    std::array<std::vector<float>, 2> w, state;
    for (int r = 0; r < 2; ++r) {
      w[r].assign(kStart[r].begin(), kStart[r].end());
      state[r].resize(opt.state_floats());
      opt.init_state(state[r]);
    }
    for (const auto& step : kUpdates)
      for (const auto& [r, g] : step) {
        const std::vector<float> grad(g.begin(), g.end());
        opt.update(w[r], state[r], grad);
      }
    const auto want = reference(c);
    for (int r = 0; r < 2; ++r)
      for (int j = 0; j < kDim; ++j) {
        CAPTURE(r);
        CAPTURE(j);
        CHECK(w[r][j] == doctest::Approx(want[r][j]).epsilon(1e-5));
      }
  }
  // FTRL's l1 holds a weight at exactly 0 while |z| stays within it.
  RowOptimizerConfig sparse;
  sparse.kind = RowOptimizerKind::ftrl;
  sparse.lr = 1;
  sparse.l1 = 10;
  const RowOptimizer ftrl(sparse, 1);
  std::vector<float> w{0.3f}, s(ftrl.state_floats(), 0.0f);
  ftrl.update(w, s, std::vector<float>{0.5f});
  CHECK(w[0] == 0.0f);
}

TEST_CASE("row optimizers: names, state sizes, and an unknown name refused") {
  CHECK(row_optimizer_kind("lazy_adam") == RowOptimizerKind::lazy_adam);
  CHECK_THROWS_WITH_AS(row_optimizer_kind("adamw"), doctest::Contains("unknown sparse optimizer"),
                       std::invalid_argument);
  CHECK(RowOptimizer({RowOptimizerKind::sgd}, 16).state_floats() == 0);
  CHECK(RowOptimizer({RowOptimizerKind::adagrad}, 16).state_floats() == 16);
  CHECK(RowOptimizer({RowOptimizerKind::rowwise_adagrad}, 16).state_floats() == 1);
  CHECK(RowOptimizer({RowOptimizerKind::lazy_adam}, 16).state_floats() == 33);
  CHECK(RowOptimizer({RowOptimizerKind::ftrl}, 16).state_floats() == 32);
}

TEST_CASE("unique_rows: sorted unique keys and each id's place among them") {
  const TableSpec fixed{"t", 4, 10};
  const std::vector<std::uint64_t> ids{13, 7, 3, 23, 7};
  const auto rows = unique_rows(fixed, ids);
  CHECK(rows.keys == std::vector<std::uint64_t>{3, 7});
  CHECK(rows.inverse == std::vector<std::uint32_t>{0, 1, 0, 0, 1});
}
