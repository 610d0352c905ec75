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

// One worker step on the worker's own link, chunk by chunk (the header's
// statement): the forward takes a third of the step and the backward the
// rest, handing over each variable's gradient, the last variable first,
// after a share of the backward proportional to the variable's size (a
// device's backward roughly does). A chunk leaves when its gradient exists
// and the link is free and takes `seconds_per_byte` of it per byte; with
// `replies`, its new weights come back on the other direction once it has
// arrived. The step ends when the compute and the last chunk (or reply) do.
// `rows_s`: the embedding rows' time on the link each way, pulled before
// the forward and pushed after the backward.
double worker_step_s(const ShardMap& map, double step_s, double seconds_per_byte, bool replies,
                     double rows_s = 0) {
  const auto& variables = map.variables();
  double total = 0;
  for (const auto& v : variables) total += static_cast<double>(v.size);
  double produced = 0, sent = rows_s, done = rows_s;
  for (std::size_t i = variables.size(); i-- > 0;) {
    produced += static_cast<double>(variables[i].size);
    const double ready = rows_s + step_s / 3 + step_s * 2 / 3 * produced / total;
    for (const ChunkRef& c : map.chunks(static_cast<std::uint32_t>(i))) {
      const double seconds = static_cast<double>(c.count * sizeof(float)) * seconds_per_byte;
      sent = std::max(sent, ready) + seconds;
      done = replies ? std::max(done, sent) + seconds : sent;
    }
  }
  if (rows_s > 0) done = std::max(done, std::max(sent, rows_s + step_s) + rows_s);
  return std::max(done, rows_s + step_s);
}

}  // namespace

ThroughputPrediction predict_throughput(const ThroughputInput& in) {
  if (in.workers == 0 || in.servers == 0 || in.variables.empty())
    throw std::invalid_argument("throughput model: needs workers, servers and variables");
  if (!(in.link_bits_per_s > 0) || !(in.step_ms > 0) || !(in.apply_bytes_per_s > 0) ||
      !(in.wire_bytes_per_value > 0) || !(in.row_bytes >= 0))
    throw std::invalid_argument(
        "throughput model: the link rate, step time and apply rate must be positive");
  const double link = in.link_bits_per_s / 8 / kFraming;  // payload bytes/s each way
  const double wire = in.wire_bytes_per_value / sizeof(float);
  const double workers = in.workers;
  const ShardMap map(in.variables, in.servers, in.chunk_bytes);
  double model_bytes = 0;  // float32
  for (const auto& v : in.variables) model_bytes += static_cast<double>(v.size * sizeof(float));
  std::uint64_t busiest = 0;
  for (std::uint32_t s = 0; s < in.servers; ++s) busiest = std::max(busiest, map.bytes_on(s));
  const double compute_s = in.step_ms / 1000;

  std::vector<std::pair<double, const char*>> bounds;
  const double rows_per_ps = in.row_bytes / in.servers;
  if (in.allreduce) {
    const double ring = 2 * (workers - 1) / workers / link;  // seconds a gradient byte
    const double writes = model_bytes * wire / link / std::max<std::uint32_t>(in.sync_every, 1);
    bounds = {{worker_step_s(map, compute_s, ring, false, in.row_bytes / link) + writes,
               workers > 1        ? "worker: compute and all-reduce"
               : in.row_bytes > 0 ? "worker: compute and its link"
                                  : "compute"},
              {workers * rows_per_ps / link, "ps link"}};
  } else {
    bounds = {{worker_step_s(map, compute_s, wire / link, true, in.row_bytes / link),
               "worker: compute and its link"},
              {workers * (static_cast<double>(busiest) * wire + rows_per_ps) / link, "ps link"},
              {workers * (static_cast<double>(busiest) + rows_per_ps) / in.apply_bytes_per_s,
               "ps apply"}};
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
