#include "shared/config_reader.h"

#include <algorithm>

namespace pstrain::config_detail {

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string listed(const std::vector<std::string>& names, std::string_view last_sep) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += (i + 1 == names.size()) ? last_sep : ", ";
    out += names[i];
  }
  return out;
}

std::string shown(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

std::string Range::text(std::string_view noun) const {
  const auto num = number<double>;
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  std::string out(noun);
  if (has_lo && has_hi && !lo_open && !hi_open) return out + " in " + num(lo) + ".." + num(hi);
  if (has_lo && has_hi) {
    return out + " in " + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
  }
  if (has_lo) return out + (lo_open ? " > " : " >= ") + num(lo);
  if (has_hi) return out + (hi_open ? " < " : " <= ") + num(hi);
  return out;
}

void Reader::fail(const std::string& path, const std::string& what) const {
  throw ConfigError(origin_ + ": " + (path.empty() ? "" : path + ": ") + what);
}

void Reader::keys(const YAML::Node& node, const std::string& path,
                  const std::vector<std::string>& allowed, std::string_view what) const {
  if (node.IsNull()) return;
  if (!node.IsMap()) fail(path, "expected " + std::string(what) + ", got " + shown(node));
  std::vector<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) fail(path, "keys must be plain names, got " + shown(kv.first));
    const std::string key = kv.first.Scalar();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      fail(join(path, key), "unknown key (expected one of: " + listed(allowed, ", ") + ")");
    }
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      fail(join(path, key), "given more than once");
    }
    seen.push_back(key);
  }
}

std::string Reader::text(const YAML::Node& node, const std::string& path) const {
  if (!node.IsScalar() || node.Scalar().empty()) {
    fail(path, "expected a non-empty string, got " + shown(node));
  }
  return node.Scalar();
}

std::string Reader::choice(const YAML::Node& node, const std::string& path,
                           const std::vector<std::string>& options) const {
  if (node.IsScalar() &&
      std::find(options.begin(), options.end(), node.Scalar()) != options.end()) {
    return node.Scalar();
  }
  fail(path, "expected " + listed(options, " or ") + ", got " + shown(node));
}

bool Reader::boolean(const YAML::Node& node, const std::string& path) const {
  bool value = false;
  if (!node.IsScalar() || !YAML::convert<bool>::decode(node, value)) {
    fail(path, "expected true or false, got " + shown(node));
  }
  return value;
}

}  // namespace pstrain::config_detail
