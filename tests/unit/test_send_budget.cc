// The ps's send budget without ZeroMQ: claims taken and given back, by peer
// and in all, and given back from another thread as ZeroMQ's I/O thread does.
#include <doctest/doctest.h>

#include <thread>

#include "server/send_budget.h"

using namespace pstrain;
using namespace pstrain::ps;

TEST_CASE("send budget: a peer gets its share and no more; all peers the total") {
  SendBudget budget(100, 250);
  auto a1 = budget.claim("a", 60);
  REQUIRE(a1);
  CHECK_FALSE(budget.claim("a", 41));  // 101 for a
  auto a2 = budget.claim("a", 40);
  REQUIRE(a2);
  CHECK(budget.queued("a") == 100);
  auto b = budget.claim("b", 100);
  REQUIRE(b);
  CHECK_FALSE(budget.claim("c", 51));  // 251 in all
  auto c = budget.claim("c", 50);
  REQUIRE(c);
  CHECK(budget.queued() == 250);

  // Released on another thread, as ZeroMQ's I/O thread does.
  std::thread([&] { a1.reset(); }).join();
  CHECK(budget.queued("a") == 40);
  CHECK(budget.queued() == 190);
  CHECK(budget.claim("a", 60));  // given back at once: a temporary

  b.reset();
  budget.forget_idle();
  CHECK(budget.queued("b") == 0);
  CHECK(budget.queued("a") == 40);
}

TEST_CASE("send budget: a reply costs its bytes, but a chunk buffer shared with the store none") {
  const auto header = 100;
  const std::size_t frames2 = 2 * SendBudget::kFrameOverhead,
                    frames3 = 3 * SendBudget::kFrameOverhead;
  CHECK(SendBudget::cost(header, {}) == header + frames2);
  const auto bytes = std::make_shared<const std::vector<std::uint8_t>>(5000);
  CHECK(SendBudget::cost(header, bytes) == header + frames3 + 5000);
  const ValueBuffer values = std::make_shared<std::vector<float>>(1'000'000);
  CHECK(SendBudget::cost(header, values) == header + frames3);
}
