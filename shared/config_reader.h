#pragma once
// Reading one YAML value of a cluster file: is it what the key wants?
//
// Every check throws ConfigError as "<origin>: <dotted.key>: expected ...,
// got ...", so a user sees which file, which key and what was wrong. The
// field tables (shared/config_field.h) build on these checks; nothing here
// knows the schema.
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "shared/config.h"

namespace pstrain::config_detail {

// "path.key", or "key" at the top level.
std::string join(const std::string& path, const std::string& key);
// "a, b or c" with last_sep " or ".
std::string listed(const std::vector<std::string>& names, std::string_view last_sep);
// How a node that was not what we wanted looks to the user: 'text', a list...
std::string shown(const YAML::Node& node);

// Shortest text that reads back to the same value, so to_yaml round-trips.
template <class T>
std::string number(T value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, end);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// A closed or open interval, spelled out in error messages.
struct Range {
  double lo = -kInf;
  bool lo_open = false;
  double hi = kInf;
  bool hi_open = false;

  bool contains(double x) const {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  // "an integer in 1..65535", "a number > 0", ...
  std::string text(std::string_view noun) const;
};

inline const Range kPositive{0, true, kInf, false};
inline const Range kNonNegative{0, false, kInf, false};
inline const Range kUnitOpen{0, false, 1, true};  // [0, 1)

inline Range at_least(double lo) { return Range{lo, false, kInf, false}; }
inline Range between(double lo, double hi) { return Range{lo, false, hi, false}; }

// Reads and checks the values of one document; every error names `origin`
// and the key's dotted path.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const;

  // `node` must be a map whose keys all come from `allowed`. An empty entry
  // (`train:` with every key commented out) counts as an empty map.
  void keys(const YAML::Node& node, const std::string& path,
            const std::vector<std::string>& allowed, std::string_view what) const;

  std::string text(const YAML::Node& node, const std::string& path) const;
  std::string choice(const YAML::Node& node, const std::string& path,
                     const std::vector<std::string>& options) const;
  bool boolean(const YAML::Node& node, const std::string& path) const;

  template <class T>
  T integer(const YAML::Node& node, const std::string& path, Range range) const {
    return parsed<T>(node, path, range, range.text("an integer"));
  }

  template <class T>
  T real(const YAML::Node& node, const std::string& path, Range range) const {
    return parsed<T>(node, path, range, range.text("a number"));
  }

 private:
  // The whole scalar as a T within `range` (finite, for floating point).
  template <class T>
  T parsed(const YAML::Node& node, const std::string& path, Range range,
           const std::string& expected) const {
    if (!node.IsScalar()) fail(path, "expected " + expected + ", got " + shown(node));
    const std::string& s = node.Scalar();
    T value{};
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    bool ok = ec == std::errc() && end == s.data() + s.size() &&
              range.contains(static_cast<double>(value));
    if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(value);
    if (!ok) fail(path, "expected " + expected + ", got " + shown(node));
    return value;
  }

  std::string origin_;
};

}  // namespace pstrain::config_detail
