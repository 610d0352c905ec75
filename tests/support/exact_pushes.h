#pragma once
// The exactness workload of the ps's multi-process tests: forked client
// processes push integer gradients to "w" (40,000 values over many chunks on
// every server) and "b" (10 values, one chunk), two steps in flight and
// push_pull mixed in so replies and resends of different tickets
// interleave. With SGD and lr = 1 every update is exact, so the final values
// must equal the initial ones less the sum of every push, bit for bit: an
// update lost or applied twice shows.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "client/ps/ps_client.h"
#include "tests/support/ps_cluster.h"

namespace pstrain::testing {

inline std::vector<VariableSpec> exact_push_variables() {
  return {{"w", 40000, {InitKind::zeros, 0}}, {"b", 10, {InitKind::zeros, 0}}};
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Runs `clients` processes of `steps` steps each against `config`'s servers
// (SGD, lr 1) and CHECKs the final values; `meanwhile` (a failure to
// inflict) runs in this process while the clients push. `clocked`: as a
// worker of mode ssp steps, one step at a time, each a push_pull of "w" (its
// read) and a push of "b", with the client's clock set to the step.
inline void check_exact_pushes(const ClusterConfig& config, std::uint32_t clients,
                               std::uint32_t steps,
                               const std::function<void()>& meanwhile = nullptr,
                               bool clocked = false) {
  const auto vars = exact_push_variables();
  // Gradient of client k at step s for element i: an integer in [-1, 3], so
  // the sums do not cancel.
  auto grad = [](std::uint32_t k, std::uint32_t s, std::size_t i) {
    return static_cast<float>((k * 7 + s * 3 + i) % 5) - 1.0f;
  };
  // Integer initial values, so every later value is exactly representable.
  std::vector<float> w0(40000), b0(10);
  for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = static_cast<float>(i % 1000) - 500;
  for (std::size_t i = 0; i < b0.size(); ++i) b0[i] = static_cast<float>(i) * 3;
  {
    PsClient setup(config, kTool, shard_map_for(config, vars));
    setup.hello();
    setup.init(1);
    setup.wait(setup.assign("w", w0));
    setup.wait(setup.assign("b", b0));
  }

  std::vector<std::unique_ptr<ForkedClient>> children;
  for (std::uint32_t k = 0; k < clients; ++k) {
    children.push_back(std::make_unique<ForkedClient>([&, k] {
      PsClient ps(config, k, shard_map_for(config, vars));
      ps.hello();
      std::vector<float> gw[2] = {std::vector<float>(40000), std::vector<float>(40000)};
      std::vector<float> gb[2] = {std::vector<float>(10), std::vector<float>(10)};
      std::vector<float> out(40000);
      PsClient::Ticket pending[2][2] = {};
      for (std::uint32_t s = 0; s < steps; ++s) {
        if (clocked) {
          for (std::size_t i = 0; i < gw[0].size(); ++i) gw[0][i] = grad(k, s, i);
          for (std::size_t i = 0; i < gb[0].size(); ++i) gb[0][i] = grad(k, s, i);
          ps.set_clock(s);
          ps.wait(ps.push_pull("w", gw[0], out));
          ps.wait(ps.push("b", gb[0]));
          continue;
        }
        const auto slot = s % 2;
        if (pending[slot][0]) {
          ps.wait(pending[slot][0]);
          ps.wait(pending[slot][1]);
        }
        for (std::size_t i = 0; i < gw[slot].size(); ++i) gw[slot][i] = grad(k, s, i);
        for (std::size_t i = 0; i < gb[slot].size(); ++i) gb[slot][i] = grad(k, s, i);
        pending[slot][0] = s % 3 == 1 ? ps.push_pull("w", gw[slot], out) : ps.push("w", gw[slot]);
        pending[slot][1] =
            s % 3 == 2 ? ps.push_pull("b", gb[slot], gb[slot]) : ps.push("b", gb[slot]);
      }
      ps.wait_all();
    }));
  }
  if (meanwhile) meanwhile();
  for (auto& c : children) REQUIRE(c->wait_for(std::chrono::seconds(120)) == 0);

  std::vector<float> w_expect = w0, b_expect = b0;
  for (std::uint32_t k = 0; k < clients; ++k)
    for (std::uint32_t s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < w_expect.size(); ++i) w_expect[i] -= grad(k, s, i);
      for (std::size_t i = 0; i < b_expect.size(); ++i) b_expect[i] -= grad(k, s, i);
    }
  PsClient check(config, kTool, shard_map_for(config, vars));
  std::vector<float> w(40000), b(10);
  check.wait(check.pull("w", w));
  check.wait(check.pull("b", b));
  CHECK(bit_equal(w, w_expect));
  CHECK(bit_equal(b, b_expect));
  // The expected values are not trivially the initial ones.
  CHECK_FALSE(bit_equal(w_expect, w0));
}

}  // namespace pstrain::testing
