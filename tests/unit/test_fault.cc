// Fault injection (shared/fault.h, net.fault): the configured fraction of
// data messages is dropped, control messages never are, the decisions are
// reproducible from the seed, and the config keys are read and bounded.
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "shared/config.h"
#include "shared/fault.h"

using namespace pstrain;
using wire::Op;

TEST_CASE("fault: off by default, nothing is dropped") {
  FaultInjector faults({}, 1);
  for (int i = 0; i < 1000; ++i) CHECK_FALSE(faults.drop(Op::push));
}

TEST_CASE("fault: drops the configured fraction of data messages and no control message") {
  FaultInjector faults({.drop = 0.1}, 42);
  int dropped = 0;
  constexpr int kN = 20000;
  const Op data[] = {Op::init, Op::pull, Op::push, Op::push_pull, Op::assign};
  for (int i = 0; i < kN; ++i) dropped += faults.drop(data[i % 5]) ? 1 : 0;
  CHECK(dropped > kN * 0.09);
  CHECK(dropped < kN * 0.11);
  for (const auto op :
       {Op::hello, Op::heartbeat, Op::progress, Op::barrier, Op::done, Op::kv_get, Op::stats})
    for (int i = 0; i < 200; ++i) CHECK_FALSE(faults.drop(op));
}

TEST_CASE("fault: the same seed draws the same decisions, another seed others") {
  auto decisions = [](std::uint64_t seed) {
    FaultInjector faults({.drop = 0.3}, seed);
    std::vector<bool> out;
    for (int i = 0; i < 200; ++i) out.push_back(faults.drop(Op::push));
    return out;
  };
  CHECK(decisions(5) == decisions(5));
  CHECK(decisions(5) != decisions(6));
}

TEST_CASE("fault: delay_ms holds data messages, not control messages") {
  FaultInjector faults({.delay_ms = 30}, 1);
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  CHECK_FALSE(faults.drop(Op::pull));
  CHECK(Clock::now() - start >= std::chrono::milliseconds(30));
  start = Clock::now();
  CHECK_FALSE(faults.drop(Op::heartbeat));
  CHECK(Clock::now() - start < std::chrono::milliseconds(30));
}

TEST_CASE("fault: net.fault keys are read, default to off, and are bounded") {
  const std::string base = "ps: [{host: 127.0.0.1, port: 7000}]\nworkers: {count: 1}\n";
  const auto off = parse_config(base, {}, "t.yaml");
  CHECK(off.net.fault.drop == 0);
  CHECK(off.net.fault.delay_ms == 0);
  const auto on = parse_config(base + "net: {fault: {drop: 0.1, delay_ms: 5}}\n", {}, "t.yaml");
  CHECK(on.net.fault.drop == 0.1);
  CHECK(on.net.fault.delay_ms == 5);
  CHECK(on.hash() != off.hash());
  CHECK(parse_config(base, {"net.fault.drop=0.25"}, "t.yaml").net.fault.drop == 0.25);
  CHECK_THROWS_WITH_AS(parse_config(base + "net: {fault: {drop: 1}}\n", {}, "t.yaml"),
                       doctest::Contains("net.fault.drop: expected a number in [0, 1)"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_config(base + "net: {fault: {delay_ms: -1}}\n", {}, "t.yaml"),
                       doctest::Contains("net.fault.delay_ms"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_config(base + "net: {retry_interval: 0}\n", {}, "t.yaml"),
                       doctest::Contains("net.retry_interval: expected a number > 0"), ConfigError);
}
