#include "app/plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <sstream>

#include "client/data/dataset.h"
#include "client/model/model.h"
#include "shared/embedding.h"
#include "shared/modes.h"
#include "shared/throughput_model.h"

namespace pstrain {
namespace {

std::string thousands(double value) {
  std::string digits = std::to_string(static_cast<long long>(value + 0.5));
  for (int at = static_cast<int>(digits.size()) - 3; at > 0; at -= 3)
    digits.insert(static_cast<std::size_t>(at), ",");
  return digits;
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

struct Wire {
  const char* name;
  double bytes;
};

// Float32 bytes of the embedding rows a worker's step pulls (and pushes
// back): each embedding layer's unique rows in a batch, averaged over the
// first batches of worker 0's training data in file order (counted, not
// guessed: how often ids repeat within a batch is the data's).
struct RowTraffic {
  double bytes = 0;
  std::size_t batches = 0;
};

RowTraffic row_traffic(const ClusterConfig& config, const std::vector<EmbeddingInput>& layers) {
  constexpr std::size_t kBatches = 20;
  RowTraffic traffic;
  if (layers.empty()) return traffic;
  const Dataset data =
      load_dataset(config.data, true, 0, static_cast<std::uint32_t>(config.workers.size()));
  const std::size_t batch = config.train.batch_size;
  std::vector<std::uint64_t> ids;
  for (std::size_t b = 0; b < kBatches && (b + 1) * batch <= data.size(); ++b) {
    for (const EmbeddingInput& layer : layers) {
      const auto table = std::ranges::find(config.tables, layer.table, &TableSpec::name);
      ids.clear();
      for (std::size_t s = b * batch; s < (b + 1) * batch; ++s) {
        const std::uint64_t* first = data.sample_ids(s) + layer.first_id;
        ids.insert(ids.end(), first, first + layer.ids);
      }
      traffic.bytes +=
          static_cast<double>(unique_rows(*table, ids).keys.size() * table->dim * sizeof(float));
    }
    ++traffic.batches;
  }
  if (traffic.batches > 0) traffic.bytes /= static_cast<double>(traffic.batches);
  return traffic;
}

}  // namespace

std::string plan_report(const ClusterConfig& config, const PlanRequest& request) {
  if (config.mode == Mode::local_sgd)
    throw ConfigError("--plan: mode local is not modelled (modes async, ssp, backup and sync are)");
  const DataShape shape = data_shape(config.data);
  const InputShape input{shape.channels, shape.height, shape.width};
  ThroughputInput in;
  in.variables = Model::variables_of(config.model, input, shape.classes, config.tables);
  const RowTraffic rows =
      row_traffic(config, Model::check(config.model, input, shape.classes, config.tables));
  in.row_bytes = rows.bytes;
  in.workers = static_cast<std::uint32_t>(config.workers.size());
  in.batch = config.train.batch_size;
  in.chunk_bytes = config.net.chunk_bytes;
  in.step_ms = request.step_ms;
  in.link_bits_per_s = request.link_bits_per_s;
  in.apply_bytes_per_s = request.apply_bytes_per_s;
  in.allreduce = traits(config.mode).allreduce();
  in.sync_every = config.train.sync_every;
  std::uint64_t parameters = 0;
  for (const auto& v : in.variables) parameters += v.size;

  std::ostringstream out;
  out << "pstrain --plan: " << config.job << ", model " << config.model.preset << " ("
      << thousands(static_cast<double>(parameters)) << " parameters, "
      << fixed(static_cast<double>(parameters) * 4 / 1e6, 2) << " MB in float32), mode "
      << to_string(config.mode) << ", " << in.workers << " workers x batch " << in.batch << "\n"
      << "a step's compute " << fixed(request.step_ms, 3) << " ms; each host on its own link of "
      << fixed(request.link_bits_per_s / 1e6, 0) << " Mbit/s each way; a ps applies "
      << fixed(request.apply_bytes_per_s / 1e9, 1) << " GB/s of gradient\n";
  if (rows.batches > 0)
    out << "embedding rows: " << fixed(rows.bytes / 1e6, 3)
        << " MB a step each way (float32; the unique rows of the first " << rows.batches
        << " batches of the training data)\n";
  out << "\n";

  const Wire wires[] = {{"fp32", 4}, {"bf16", 2}};
  std::set<std::uint32_t> counts = {1, 2, 4, 8, static_cast<std::uint32_t>(config.ps.size())};
  out << "| ps | samples/s, fp32 | bound by | samples/s, bf16 | bound by "
         "|\n|---|---|---|---|---|\n";
  struct Best {
    double rate = 0;
    std::vector<std::pair<std::uint32_t, double>> by_count;
  };
  Best best[2];
  for (const std::uint32_t p : counts) {
    in.servers = p;
    out << "| " << p << (p == config.ps.size() ? " (this file)" : "");
    for (int w = 0; w < 2; ++w) {
      in.wire_bytes_per_value = wires[w].bytes;
      const ThroughputPrediction pred = predict_throughput(in);
      out << " | " << thousands(pred.samples_per_s) << " | " << pred.limit;
      best[w].rate = std::max(best[w].rate, pred.samples_per_s);
      best[w].by_count.emplace_back(p, pred.samples_per_s);
    }
    out << " |\n";
  }
  out << "\n";
  for (int w = 0; w < 2; ++w) {
    // The counts are in increasing order: the first within 10% is the fewest.
    for (const auto& [p, rate] : best[w].by_count) {
      if (rate < 0.9 * best[w].rate) continue;
      out << "wire " << wires[w].name << ": " << p << " ps (" << thousands(rate)
          << " samples/s, within 10% of the best of these counts, " << thousands(best[w].rate)
          << ")\n";
      break;
    }
  }
  if (in.allreduce)
    out << "(mode " << to_string(config.mode)
        << ": the workers all-reduce among themselves; the ps count changes only worker 0's "
           "writes)\n";
  return out.str();
}

}  // namespace pstrain
