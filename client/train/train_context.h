#pragma once
// What one worker's training works with, and what it returns.
#include <cstdint>
#include <functional>

#include "client/compute/backend.h"
#include "client/data/dataset.h"
#include "shared/config.h"
#include "shared/metrics.h"
#include "shared/metrics_registry.h"

namespace pstrain {

class Model;
class PsClient;

struct TrainSummary {
  std::uint64_t local_samples = 0;
  std::uint64_t global_samples = 0;  // as last reported by ps 0
  std::uint64_t steps = 0;
  double seconds = 0;
};

// Called after every progress report to ps 0 with the global sample count
// and the worker's recent loss; worker 0 uses it to trigger evaluations and
// show progress.
using ReportHook = std::function<void(std::uint64_t global_samples, double epoch, double loss,
                                      double samples_per_s)>;

// One worker's model on its backend, its part of the data, its ps client,
// metrics file and metrics registry, and the report hook.
struct TrainContext {
  const ClusterConfig& config;
  std::uint32_t index;
  Backend& backend;
  Model& model;
  PsClient& ps;
  WorkerShard& shard;
  MetricsFile& metrics;
  MetricsRegistry& registry;
  ReportHook hook;
};

}  // namespace pstrain
