// The planner's throughput model (shared/throughput_model.h): each bound of
// a round computed by hand from the header's statement, which one binds as
// servers are added, the wire format's bytes, sync's ring, and link rates
// in tc's spelling.
#include <doctest/doctest.h>

#include <stdexcept>
#include <utility>

#include "shared/throughput_model.h"

using namespace pstrain;

namespace {

// Payload bytes per second of a link of `bits` per second, after the
// headers of TCP over Ethernet (66 bytes a 1448-byte segment).
double payload(double bits) { return bits / 8 * 1448.0 / 1514.0; }

ThroughputInput one_variable(std::uint64_t floats) {
  ThroughputInput in;
  in.variables = {{"w", floats, {}}};
  in.workers = 2;
  in.servers = 1;
  in.batch = 64;
  in.chunk_bytes = 256 * 1024;
  in.step_ms = 2;
  in.link_bits_per_s = 1e9;
  in.apply_bytes_per_s = 4e9;
  return in;
}

}  // namespace

TEST_CASE("throughput model: one ps is bound by its link, two by the workers'") {
  // 1,048,576 floats: 4 MiB in 16 chunks of 256 KiB.
  auto in = one_variable(1 << 20);
  const double model = 4.0 * (1 << 20), link = payload(1e9);
  auto p = predict_throughput(in);
  // The ps takes both workers' 4 MiB each way on its one link.
  CHECK(p.limit == "ps link");
  CHECK(p.round_ms == doctest::Approx(2 * model / link * 1000));
  CHECK(p.samples_per_s == doctest::Approx(2 * 64 / (2 * model / link)));
  // Two ps halve it; a worker's own link with its compute binds now.
  in.servers = 2;
  p = predict_throughput(in);
  CHECK(p.limit == "worker: compute and its link");
  CHECK(p.round_ms == doctest::Approx(2 + (model + 256 * 1024) / link * 1000));
  // bf16 on the wire halves every byte.
  in.wire_bytes_per_value = 2;
  p = predict_throughput(in);
  CHECK(p.round_ms == doctest::Approx(2 + (model + 256 * 1024) / 2 / link * 1000));
}

TEST_CASE("throughput model: a late layer's push is hidden under the backward of the early ones") {
  // Variable 0: 4 MiB (16 chunks), its gradient ready at the step's end;
  // variable 1: one chunk of 256 KiB, ready after 1/17 of the backward.
  auto in = one_variable(1 << 20);
  in.variables.push_back({"b", 1 << 16, {}});
  in.servers = 2;
  in.step_ms = 30;
  const double chunk = 256.0 * 1024, link = payload(1e9);
  const auto p = predict_throughput(in);
  CHECK(p.limit == "worker: compute and its link");
  // Variable 1's push and reply end long before the backward does (11.2 ms
  // + 2 chunk times); variable 0's 16 chunks leave at 30 ms, and the last
  // one's reply follows them.
  CHECK(p.round_ms == doctest::Approx(30 + 17 * chunk / link * 1000));
  // Not hidden: the small variable produced last, after the big one whose
  // 16 chunks leave from 16/17 of the backward on.
  std::swap(in.variables[0], in.variables[1]);
  CHECK(predict_throughput(in).round_ms ==
        doctest::Approx(10 + 20.0 * 16 / 17 + 18 * chunk / link * 1000));
}

TEST_CASE("throughput model: embedding rows come before the forward and go after the backward") {
  auto in = one_variable(1 << 20);  // 4 MiB of dense weights, 16 chunks
  in.row_bytes = 1 << 20;           // and 1 MiB of rows each way a step
  in.servers = 2;
  const double mib = 1 << 20, link = payload(1e9);
  auto p = predict_throughput(in);
  // Rows pulled (1 MiB), the step, the 16 dense chunks, then the rows'
  // gradients (1 MiB) after the last chunk; its reply (256 KiB) is hidden.
  CHECK(p.limit == "worker: compute and its link");
  CHECK(p.round_ms == doctest::Approx(2 + 6 * mib / link * 1000));
  // One ps takes both workers' dense weights and rows each way.
  in.servers = 1;
  p = predict_throughput(in);
  CHECK(p.limit == "ps link");
  CHECK(p.round_ms == doctest::Approx(2 * 5 * mib / link * 1000));
}

TEST_CASE("throughput model: a slow optimizer binds the ps") {
  auto in = one_variable(1 << 20);
  in.servers = 4;
  in.link_bits_per_s = 100e9;
  in.apply_bytes_per_s = 1e8;
  const auto p = predict_throughput(in);
  CHECK(p.limit == "ps apply");
  // Two workers' quarter of 4 MiB each at 100 MB/s.
  CHECK(p.round_ms == doctest::Approx(2 * (1 << 20) / 1e8 * 1000));
}

TEST_CASE("throughput model: sync is compute plus the ring, and the ps count barely matters") {
  auto in = one_variable(1 << 20);
  in.allreduce = true;
  in.workers = 4;
  in.sync_every = 50;
  const double model = 4.0 * (1 << 20), link = payload(1e9);
  const auto p = predict_throughput(in);
  CHECK(p.limit == "worker: compute and all-reduce");
  CHECK(p.round_ms ==
        doctest::Approx((0.002 + 2 * 3.0 / 4 * model / link + model / link / 50) * 1000));
  in.servers = 4;
  CHECK(predict_throughput(in).round_ms == doctest::Approx(p.round_ms));
  in.workers = 1;
  in.sync_every = 1000000;
  CHECK(predict_throughput(in).round_ms == doctest::Approx(2).epsilon(0.01));
}

TEST_CASE("throughput model: rates in tc's spelling, and bad input named") {
  CHECK(parse_link_rate("100mbit") == 1e8);
  CHECK(parse_link_rate("1Gbit") == 1e9);
  CHECK(parse_link_rate("2.5gbit") == 2.5e9);
  CHECK(parse_link_rate("500kbit") == 5e5);
  CHECK(parse_link_rate("800bit") == 800);
  for (const char* bad : {"fast", "100", "mbit", "-1mbit", "0gbit", "1 gbit", "1gbps"}) {
    INFO(bad);
    CHECK_THROWS_WITH_AS(parse_link_rate(bad), doctest::Contains("is not a rate"),
                         std::invalid_argument);
  }
  auto in = one_variable(10);
  in.workers = 0;
  CHECK_THROWS_AS(predict_throughput(in), std::invalid_argument);
  in = one_variable(10);
  in.link_bits_per_s = 0;
  CHECK_THROWS_AS(predict_throughput(in), std::invalid_argument);
}
