#pragma once
// Worker 0's progress line. On a terminal it redraws one line in place;
// otherwise (a pipe, the launcher) it prints a plain line at most every
// `interval` seconds. Lines start with "progress " so the launcher can keep
// the latest one at the bottom of its own terminal.
#include <chrono>
#include <cstdint>
#include <optional>

namespace pstrain {

// What the line shows.
struct ProgressFigures {
  double epoch = 0;   // this worker's passes over its part, fractional
  double epochs = 0;  // the budget
  std::uint64_t global_samples = 0;
  double samples_per_s = 0;             // global, over the recent window
  double loss = 0;                      // this worker's recent mean training loss
  std::optional<double> test_accuracy;  // last evaluation
  std::optional<double> test_auc;       // ... of a click model
  double eta_s = -1;                    // < 0: unknown
};

class ProgressLine {
 public:
  explicit ProgressLine(double interval_s = 2.0);
  ~ProgressLine();  // ends the in-place line on a terminal
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Shows `state` if the last line is older than the interval (a terminal
  // redraws at most 10 times a second).
  void update(const ProgressFigures& state);

 private:
  bool tty_;
  double interval_s_;
  std::chrono::steady_clock::time_point last_{};
  bool drawn_ = false;
};

}  // namespace pstrain
