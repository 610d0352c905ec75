#include "shared/metrics.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace pstrain {

std::string json_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

double unix_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void JsonObject::key(std::string_view k) {
  body_ += body_.empty() ? "{\"" : ",\"";
  body_ += json_escape(k);
  body_ += "\":";
}

JsonObject& JsonObject::add(std::string_view k, double value) {
  key(k);
  if (!std::isfinite(value)) {
    body_ += "null";  // JSON has no NaN or infinity
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", value);
    body_ += buf;
  }
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, std::int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, std::uint64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, std::string_view value) {
  key(k);
  body_ += '"';
  body_ += json_escape(value);
  body_ += '"';
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

MetricsFile::MetricsFile(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  out_.open(path, std::ios::app);
  if (!out_) throw std::runtime_error("cannot write metrics file " + path.string());
}

void MetricsFile::write(const JsonObject& record) {
  const std::string body = record.str();
  char time[32];
  std::snprintf(time, sizeof time, "{\"time\":%.6f", unix_time());
  std::lock_guard lock(mutex_);
  out_ << time << (body.size() > 2 ? "," + body.substr(1) : "}") << '\n';
  out_.flush();
}

}  // namespace pstrain
