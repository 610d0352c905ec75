#pragma once
// JSON-lines metrics: one flat object per line, appended to
// <run_dir>/<role><index>.metrics.jsonl. The fields are documented in
// README.md ("Metrics"); times are UNIX seconds, durations milliseconds.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>

namespace pstrain {

// Builds one JSON object from flat key/value pairs.
class JsonObject {
 public:
  JsonObject& add(std::string_view key, double value);
  JsonObject& add(std::string_view key, std::int64_t value);
  JsonObject& add(std::string_view key, std::uint64_t value);
  JsonObject& add(std::string_view key, int value) { return add(key, std::int64_t{value}); }
  JsonObject& add(std::string_view key, std::string_view value);
  JsonObject& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, bool value);
  std::string str() const { return body_.empty() ? "{}" : body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_;
};

std::string json_escape(std::string_view text);
double unix_time();

class MetricsFile {
 public:
  explicit MetricsFile(const std::filesystem::path& path);
  // Appends one line (adds "time" first); safe from several threads.
  void write(const JsonObject& record);

 private:
  std::mutex mutex_;
  std::ofstream out_;
};

}  // namespace pstrain
