#include "shared/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <mutex>

namespace pstrain {
namespace {

struct LogSink {
  std::mutex mutex;
  std::string name = "pstrain";
  std::ofstream file;
};

LogSink& sink() {
  static LogSink s;
  return s;
}

std::string timestamp() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t t = system_clock::to_time_t(now);
  const auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms));
  return buf;
}

}  // namespace

void log_open(std::string name, const std::filesystem::path& file) {
  auto& s = sink();
  std::lock_guard lock(s.mutex);
  s.name = std::move(name);
  // Opening a stream that is still open would fail and drop the file.
  s.file.close();
  s.file.clear();
  if (file.empty()) return;
  std::filesystem::create_directories(file.parent_path());
  s.file.open(file, std::ios::app);
  if (!s.file) std::cerr << "[" << s.name << "] cannot write log file " << file << "\n";
}

void log_line(std::string_view line) {
  auto& s = sink();
  const std::string stamp = timestamp();
  std::lock_guard lock(s.mutex);
  const std::string text = stamp + " [" + s.name + "] " + std::string(line) + "\n";
  std::cerr << text << std::flush;
  if (s.file) s.file << text << std::flush;
}

void log_plain(std::string_view line) {
  auto& s = sink();
  const std::string text = std::string(line) + "\n";
  std::lock_guard lock(s.mutex);
  std::cerr << text << std::flush;
  if (s.file) s.file << text << std::flush;
}

}  // namespace pstrain
