#include "client/train/straggler.h"

#include <algorithm>

#include "shared/init.h"

namespace pstrain {
namespace {

// 53 random bits as a double in [0, 1).
double unit(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace

bool straggles(const TrainConfig& train, std::uint32_t worker) {
  const bool named = train.straggler_worker == kEveryWorker ||
                     train.straggler_worker == static_cast<std::int64_t>(worker);
  const bool slowed = train.straggler_delay_ms > 0 || train.straggler_jitter_ms > 0 ||
                      (train.straggler_pause_probability > 0 && train.straggler_pause_ms > 0);
  return named && slowed;
}

StragglerDraw straggler_draw(std::uint64_t seed, std::uint32_t worker, std::uint64_t step) {
  // Keyed apart from the other generators seeded by train.seed (data order,
  // initial values, faults), so that slowing a worker changes none of them.
  const std::uint64_t key = splitmix64(splitmix64(seed ^ 0x5772a991e5ULL) ^ worker);
  return {.jitter = unit(splitmix64(key ^ splitmix64(2 * step))),
          .pause = unit(splitmix64(key ^ splitmix64(2 * step + 1)))};
}

double straggler_delay_ms(const TrainConfig& train, StragglerDraw draw) {
  const double jittered =
      std::max(0.0, train.straggler_delay_ms + train.straggler_jitter_ms * (2 * draw.jitter - 1));
  const bool pause = draw.pause < train.straggler_pause_probability;
  return jittered + (pause ? train.straggler_pause_ms : 0.0);
}

double straggler_delay_ms(const TrainConfig& train, std::uint32_t worker, std::uint64_t step) {
  if (!straggles(train, worker)) return 0;
  return straggler_delay_ms(train, straggler_draw(train.seed, worker, step));
}

}  // namespace pstrain
