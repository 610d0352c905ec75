#pragma once
// Field tables: one entry per key of the cluster file says how the key is
// read, range-checked and written, so each key is spelled once.
//
// A table is a std::vector<Field<S>> for a struct S (a section such as
// TrainConfig, one entry of a list, the root). read_map() reads a YAML map
// into S by its table, write_fields() writes S back in the canonical form,
// and each field's `keys` feed config_keys(). An absent key keeps S's default
// member initializer: the struct is where defaults live. Adding a key is one
// line in its table plus its struct member.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shared/config_reader.h"

namespace pstrain::config_detail {

template <class S>
struct Field {
  std::string key;
  // Reads the key's value, present in the file, into `s`; `path` is the
  // key's dotted path for error messages.
  std::function<void(const Reader&, const YAML::Node&, const std::string& path, S&)> read;
  // Writes the value in its canonical form (the emitter has had the key).
  std::function<void(YAML::Emitter&, const S&)> write;
  // What an absent key means; unset: `s` keeps its default.
  std::function<void(const Reader&, const std::string& path, S&)> absent = {};
  // The dotted keys this field accepts relative to its parent: itself for a
  // value, "key.sub" for a section's keys, "key.N.sub" for a list entry's.
  std::vector<std::string> keys = {};
  // True when the value is not written: a value left out of the file to be
  // filled later (a host the scheduler gives). Unset: always written.
  std::function<bool(const S&)> omitted = {};
};

// A field holding one scalar member: `parse` reads it, `show` writes it.
template <class S, class T, class Parse, class Show>
Field<S> scalar(std::string key, T S::*member, Parse parse, Show show) {
  std::vector<std::string> keys = {key};
  return {.key = std::move(key),
          .read = [member, parse](const Reader& r, const YAML::Node& node, const std::string& path,
                                  S& s) { s.*member = parse(r, node, path); },
          .write = [member, show](YAML::Emitter& out, const S& s) { out << show(s.*member); },
          .keys = std::move(keys)};
}

// A number within `range`: an integer or a real one, as the member is.
template <class S, class T>
Field<S> bounded(std::string key, T S::*member, Range range) {
  return scalar(
      std::move(key), member,
      [range](const Reader& r, const YAML::Node& node, const std::string& path) {
        if constexpr (std::is_integral_v<T>) {
          return r.integer<T>(node, path, range);
        } else {
          return r.real<T>(node, path, range);
        }
      },
      [](T value) { return number(value); });
}

template <class S>
Field<S> flag(std::string key, bool S::*member) {
  return scalar(
      std::move(key), member,
      [](const Reader& r, const YAML::Node& node, const std::string& path) {
        return r.boolean(node, path);
      },
      [](bool value) { return std::string(value ? "true" : "false"); });
}

// A non-empty string (std::string) or path (std::filesystem::path).
template <class S, class T>
Field<S> text(std::string key, T S::*member) {
  return scalar(
      std::move(key), member,
      [](const Reader& r, const YAML::Node& node, const std::string& path) {
        return T(r.text(node, path));
      },
      [](const T& value) { return std::string(value); });
}

// How a choice's options are spelled: strings as they are, enums by their
// to_string().
inline std::string label(const std::string& option) { return option; }
template <class E>
requires std::is_enum_v<E> std::string label(E option) { return std::string(to_string(option)); }

// One of `options`, each spelled as label() spells it.
template <class S, class T>
Field<S> choice(std::string key, T S::*member, std::vector<T> options) {
  std::vector<std::string> names;
  for (const auto& option : options) names.push_back(label(option));
  return scalar(
      std::move(key), member,
      [options, names](const Reader& r, const YAML::Node& node, const std::string& path) {
        const auto at = std::find(names.begin(), names.end(), r.choice(node, path, names));
        return options[static_cast<std::size_t>(at - names.begin())];
      },
      [](const T& value) { return label(value); });
}

// The same field, absent only with an error: "missing" or "missing (why)".
template <class S>
Field<S> required(Field<S> field, std::string why) {
  field.absent = [why = std::move(why)](const Reader& r, const std::string& path, S&) {
    r.fail(path, why.empty() ? "missing" : "missing (" + why + ")");
  };
  return field;
}

// The same field, written as `show` spells the whole struct.
template <class S, class Show>
Field<S> written_as(Field<S> field, Show show) {
  field.write = [show](YAML::Emitter& out, const S& s) { out << show(s); };
  return field;
}

// A field of a member struct, read and written as a key of the outer one.
template <class Outer, class Inner>
Field<Outer> inside(Inner Outer::*member, Field<Inner> field) {
  Field<Outer> out{.key = field.key,
                   .read = [member, read = field.read](
                               const Reader& r, const YAML::Node& node, const std::string& path,
                               Outer& o) { read(r, node, path, o.*member); },
                   .write = [member, write = field.write](YAML::Emitter& e,
                                                          const Outer& o) { write(e, o.*member); },
                   .keys = field.keys};
  if (field.absent) {
    out.absent = [member, absent = field.absent](const Reader& r, const std::string& path,
                                                 Outer& o) { absent(r, path, o.*member); };
  }
  return out;
}

template <class S>
std::vector<std::string> names(const std::vector<Field<S>>& fields) {
  std::vector<std::string> out;
  for (const auto& f : fields) out.push_back(f.key);
  return out;
}

// "a map {a, b, c}", or "a map {a, b, ...}" when there are more keys.
inline std::string map_of(const std::vector<std::string>& keys) {
  if (keys.size() <= 3) return "a map {" + listed(keys, ", ") + "}";
  return "a map {" + keys[0] + ", " + keys[1] + ", ...}";
}

// Every dotted key of a table, each behind `prefix` ("train.", "ps.N.").
template <class S>
std::vector<std::string> keys_below(const std::string& prefix,
                                    const std::vector<Field<S>>& fields) {
  std::vector<std::string> out;
  for (const auto& f : fields)
    for (const auto& key : f.keys) out.push_back(prefix + key);
  return out;
}

// Reads the table's keys from `node` (a map, or null for an empty one) into
// `s`, in table order; unknown keys are not looked for.
template <class S>
void read_fields(const Reader& r, const YAML::Node& node, const std::string& path,
                 const std::vector<Field<S>>& fields, S& s) {
  for (const auto& f : fields) {
    const std::string at = join(path, f.key);
    if (const YAML::Node value = node[f.key]) {
      f.read(r, value, at, s);
    } else if (f.absent) {
      f.absent(r, at, s);
    }
  }
}

// A map of exactly the table's keys, read into `s`.
template <class S>
void read_map(const Reader& r, const YAML::Node& node, const std::string& path,
              const std::vector<Field<S>>& fields, S& s) {
  const auto keys = names(fields);
  r.keys(node, path, keys, map_of(keys));
  read_fields(r, node, path, fields, s);
}

template <class S>
void write_fields(YAML::Emitter& out, const std::vector<Field<S>>& fields, const S& s) {
  for (const auto& f : fields) {
    if (f.omitted && f.omitted(s)) continue;
    out << YAML::Key << f.key << YAML::Value;
    f.write(out, s);
  }
}

// A map of its own table, held in the member `member` of the parent.
template <class P, class S>
Field<P> section(std::string key, S P::*member, const std::vector<Field<S>>& fields) {
  std::vector<std::string> keys = keys_below(key + ".", fields);
  return {
      .key = std::move(key),
      .read = [member, &fields](const Reader& r, const YAML::Node& node, const std::string& path,
                                P& p) { read_map(r, node, path, fields, p.*member); },
      .write =
          [member, &fields](YAML::Emitter& out, const P& p) {
            out << YAML::BeginMap;
            write_fields(out, fields, p.*member);
            out << YAML::EndMap;
          },
      .keys = std::move(keys)};
}

// The entries of a list, each a map of the table's keys. The caller checks
// that `node` is a list.
template <class T>
std::vector<T> read_items(const Reader& r, const YAML::Node& node, const std::string& path,
                          const std::vector<Field<T>>& fields) {
  std::vector<T> items;
  for (std::size_t i = 0; i < node.size(); ++i) {
    T item{};
    read_map(r, node[i], join(path, std::to_string(i)), fields, item);
    items.push_back(std::move(item));
  }
  return items;
}

// A list as one line per entry: - {key: value, ...}.
template <class T>
void write_items(YAML::Emitter& out, const std::vector<Field<T>>& fields,
                 const std::vector<T>& items) {
  out << YAML::BeginSeq;
  for (const auto& item : items) {
    out << YAML::Flow << YAML::BeginMap;
    write_fields(out, fields, item);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

}  // namespace pstrain::config_detail
