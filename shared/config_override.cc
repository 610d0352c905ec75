#include "shared/config_override.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <vector>

#include "shared/config_reader.h"

namespace pstrain::config_detail {

namespace {

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

std::optional<std::size_t> as_index(const std::string& s) {
  std::size_t i = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return i;
}

}  // namespace

void apply_override(YAML::Node& root, const std::string& item) {
  const auto fail = [&](const std::string& what) -> ConfigError {
    return ConfigError("--set '" + item + "': " + what);
  };
  const std::size_t eq = item.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw fail("expected key=value (e.g. optimizer.lr=0.05)");
  }
  const std::vector<std::string> keys = split_key(item.substr(0, eq));
  if (std::any_of(keys.begin(), keys.end(), [](const auto& k) { return k.empty(); })) {
    throw fail("empty part in the key");
  }
  const std::string text = item.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    // A bare word YAML reserves, such as '*' for a bind address, is meant as
    // a string; broken lists and maps are reported.
    if (text.find_first_of("[{\"'") == 0) {
      throw fail("the value is not valid YAML (" + e.msg + ")");
    }
    value = YAML::Node(text);
  }

  // yaml-cpp nodes are handles: assigning one to another writes through, so
  // the walk moves with reset().
  YAML::Node node;
  node.reset(root);
  std::string walked;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    const bool last = i + 1 == keys.size();
    YAML::Node next;
    if (node.IsSequence()) {
      const auto index = as_index(key);
      if (!index || *index > node.size() || (*index == node.size() && !last)) {
        throw fail(walked + " is a list of " + std::to_string(node.size()) + " entries; '" + key +
                   "' is not an index of it (to replace the whole list: " + walked + "=...)");
      }
      if (*index == node.size()) {
        node.push_back(value);
        return;
      }
      next.reset(node[*index]);
    } else if (node.IsMap() || node.IsNull() || !node.IsDefined()) {
      if (last) {
        node[key] = value;
        return;
      }
      if (!node[key] || node[key].IsNull()) node[key] = YAML::Node(YAML::NodeType::Map);
      next.reset(node[key]);
    } else {
      throw fail(walked + " is a single value, not a map or list");
    }
    if (last) {
      next = value;
      return;
    }
    walked = join(walked, key);
    node.reset(next);
  }
}

}  // namespace pstrain::config_detail
