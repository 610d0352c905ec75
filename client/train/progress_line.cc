#include "client/train/progress_line.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace pstrain {
namespace {

std::string grouped(std::uint64_t n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

std::string duration(double s) {
  if (s < 0) return "?";
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
  return buf;
}

}  // namespace

ProgressLine::ProgressLine(double interval_s)
    : tty_(::isatty(STDOUT_FILENO) == 1), interval_s_(interval_s) {}

ProgressLine::~ProgressLine() {
  if (tty_ && drawn_) std::fputs("\n", stdout);
  std::fflush(stdout);
}

void ProgressLine::update(const ProgressFigures& s) {
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (since < (tty_ ? 0.1 : interval_s_)) return;
  last_ = now;

  char acc[40] = "-";
  if (s.test_accuracy) std::snprintf(acc, sizeof acc, "%.4f", *s.test_accuracy);
  // A click model's AUC says more than its accuracy (75% is no clicks).
  if (s.test_auc)
    std::snprintf(acc, sizeof acc, "%.4f | test auc %.4f", *s.test_accuracy, *s.test_auc);
  char line[256];
  std::snprintf(line, sizeof line,
                "progress epoch %.2f/%g | samples %s | %s samples/s | loss %.4f | "
                "test acc %s | ETA %s",
                s.epoch, s.epochs, grouped(s.global_samples).c_str(),
                grouped(static_cast<std::uint64_t>(s.samples_per_s)).c_str(), s.loss, acc,
                duration(s.eta_s).c_str());
  if (tty_) {
    std::fprintf(stdout, "\r\x1b[K%s", line + std::strlen("progress "));
  } else {
    std::fprintf(stdout, "%s\n", line);
  }
  std::fflush(stdout);
  drawn_ = true;
}

}  // namespace pstrain
