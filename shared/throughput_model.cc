#include "shared/throughput_model.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <stdexcept>
#include <utility>

namespace pstrain {
namespace {

// Bytes on an Ethernet link per byte of TCP payload: a 1448-byte segment
// (MTU 1500, TCP timestamps) travels with 14 + 20 + 32 bytes of headers.
constexpr double kFraming = 1514.0 / 1448.0;

}  // namespace

ThroughputPrediction predict_throughput(const ThroughputInput& in) {
  if (in.workers == 0 || in.servers == 0 || in.variables.empty())
    throw std::invalid_argument("throughput model: needs workers, servers and variables");
  if (!(in.link_bits_per_s > 0) || !(in.step_ms > 0) || !(in.apply_bytes_per_s > 0) ||
      !(in.wire_bytes_per_value > 0))
    throw std::invalid_argument(
        "throughput model: the link rate, step time and apply rate must be positive");
  const double link = in.link_bits_per_s / 8 / kFraming;  // payload bytes/s each way
  const double wire = in.wire_bytes_per_value / sizeof(float);
  const double workers = in.workers;
  const ShardMap map(in.variables, in.servers, in.chunk_bytes);
  double model_bytes = 0;  // float32
  std::uint64_t largest = 0;
  for (const auto& v : in.variables) {
    model_bytes += static_cast<double>(v.size * sizeof(float));
    largest = std::max<std::uint64_t>(largest, v.size * sizeof(float));
  }
  std::uint64_t busiest = 0;
  for (std::uint32_t s = 0; s < in.servers; ++s) busiest = std::max(busiest, map.bytes_on(s));
  const double compute_s = in.step_ms / 1000;

  std::vector<std::pair<double, const char*>> bounds;
  if (in.allreduce) {
    const double ring = workers > 1 ? 2 * (workers - 1) / workers * model_bytes / link : 0;
    const double writes = model_bytes * wire / link / std::max<std::uint32_t>(in.sync_every, 1);
    bounds = {{compute_s + ring + writes, ring > 0 ? "worker: compute and all-reduce" : "compute"}};
  } else {
    const double chunk = static_cast<double>(std::min(in.chunk_bytes, largest)) * wire;
    const double worker = compute_s + (model_bytes * wire + chunk) / link;
    bounds = {{worker, "worker: compute and its link"},
              {workers * static_cast<double>(busiest) * wire / link, "ps link"},
              {workers * static_cast<double>(busiest) / in.apply_bytes_per_s, "ps apply"}};
  }
  const auto slowest = std::ranges::max_element(
      bounds, [](const auto& a, const auto& b) { return a.first < b.first; });
  ThroughputPrediction p;
  p.round_ms = slowest->first * 1000;
  p.samples_per_s = workers * in.batch / slowest->first;
  p.limit = slowest->second;
  return p;
}

double parse_link_rate(std::string_view text) {
  static constexpr std::array<std::pair<std::string_view, double>, 5> kUnits = {
      {{"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"tbit", 1e12}, {"bit", 1}}};
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [unit, scale] : kUnits) {
    if (lower.size() <= unit.size() || !lower.ends_with(unit)) continue;
    double value = 0;
    const char* end = lower.data() + lower.size() - unit.size();
    const auto [at, ec] = std::from_chars(lower.data(), end, value);
    if (ec == std::errc() && at == end && value > 0) return value * scale;
    break;
  }
  throw std::invalid_argument("'" + std::string(text) +
                              "' is not a rate: give a number and bit, kbit, mbit, gbit or tbit "
                              "(per second), e.g. 100mbit or 1gbit");
}

}  // namespace pstrain
