#pragma once
// pstrain --plan: the job of a cluster file predicted on hosts joined by
// links of a given rate, for 1, 2, 4 and 8 ps (and the file's own count)
// and each wire format, with the fewest ps that come within 10% of the
// best (shared/throughput_model.h says what is modelled and what is not;
// docs/scaling.md how well it predicted measured runs).
#include <string>

#include "shared/config.h"

namespace pstrain {

struct PlanRequest {
  double link_bits_per_s = 0;    // each host's link, each way
  double step_ms = 0;            // a worker's forward and backward
  double apply_bytes_per_s = 0;  // float32 gradient one ps applies per second
};

// The table and the recommendation, as printed. Throws ConfigError for a
// model the file does not describe, or mode local (not modelled).
std::string plan_report(const ClusterConfig& config, const PlanRequest& request);

}  // namespace pstrain
