#include "shared/metrics_registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <type_traits>

namespace pstrain {
namespace {

// The exposition format's float syntax: Go's shortest round-trip form, with
// its spellings of the infinities and NaN.
std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, value).ptr;
  return {buf, end};
}

// HELP text escapes backslash and newline; label values also the quote.
std::string escape(std::string_view text, bool quote) {
  std::string out;
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quote)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

// [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; label names have no colons.
bool valid_name(std::string_view name, bool colons) {
  auto first = [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colons && c == ':');
  };
  auto rest = [&](char c) { return first(c) || (c >= '0' && c <= '9'); };
  return !name.empty() && first(name[0]) && std::all_of(name.begin() + 1, name.end(), rest);
}

// A label label_set() renders: `name="value"`, the value escaped.
std::string label_pair(const std::string& name, std::string_view value) {
  return name + "=\"" + escape(value, true) + '"';
}

// Label names beginning with "__" are reserved for Prometheus' own use.
bool valid_label_name(std::string_view name) {
  return valid_name(name, false) && !name.starts_with("__");
}

// `{c="1",a="x",b="y"}`: the constant labels (rendered), the series' own
// (with `le` last for a histogram bucket), or nothing when there are none.
std::string label_set(const std::string& constant, const std::vector<std::string>& names,
                      const LabelValues& values, const std::string* le = nullptr) {
  std::string out = constant.empty() ? "" : "{" + constant;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (out.empty() ? "{" : ",") + label_pair(names[i], values[i]);
  if (le) out += (out.empty() ? "{" : ",") + std::string("le=\"") + *le + '"';
  return out.empty() ? out : out + '}';
}

void sample(std::string& out, const std::string& name, const std::string& labels, double value) {
  out += name + labels + ' ' + format_value(value) + '\n';
}

template <class Metric>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<Metric, Counter>)
    return "counter";
  else if constexpr (std::is_same_v<Metric, Gauge>)
    return "gauge";
  else
    return "histogram";
}

// A counter's or a gauge's one sample.
template <class Metric>
void render_series(std::string& out, const std::string& name, const std::string& constant,
                   const std::vector<std::string>& label_names, const LabelValues& values,
                   const Metric& metric) {
  sample(out, name, label_set(constant, label_names, values), metric.value());
}

void render_series(std::string& out, const std::string& name, const std::string& constant,
                   const std::vector<std::string>& label_names, const LabelValues& values,
                   const Histogram& histogram) {
  const auto s = histogram.snapshot();
  const auto bounds = histogram.bounds();
  for (std::size_t b = 0; b < s.cumulative.size(); ++b) {
    const std::string le = b < bounds.size() ? format_value(bounds[b]) : "+Inf";
    sample(out, name + "_bucket", label_set(constant, label_names, values, &le),
           static_cast<double>(s.cumulative[b]));
  }
  const auto labels = label_set(constant, label_names, values);
  sample(out, name + "_sum", labels, s.sum);
  sample(out, name + "_count", labels, static_cast<double>(s.count));
}

}  // namespace

void Counter::add(double amount) {
  if (!(amount >= 0)) throw std::invalid_argument("a counter only goes up");
  value_.fetch_add(amount, std::memory_order_relaxed);
}

void Gauge::add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }

void Gauge::raise(double value) {
  double current = value_.load(std::memory_order_relaxed);
  while (value > current &&
         !value_.compare_exchange_weak(current, value, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::span<const double> bounds)
    : bounds_(bounds), counts_(bounds.size() + 1) {}

void Histogram::observe(double value) {
  // NaN compares false with every bound and lands in +Inf, as in Prometheus.
  const auto bucket = static_cast<std::size_t>(
      std::ranges::find_if(bounds_, [&](double bound) { return value <= bound; }) -
      bounds_.begin());
  MutexLock lock(mutex_);
  counts_[bucket] += 1;
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  MutexLock lock(mutex_);
  s.sum = sum_;
  for (const auto n : counts_) s.cumulative.push_back(s.count += n);
  return s;
}

Family::Family(std::string name, std::string help, std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {
  if (!valid_name(name_, true)) throw std::invalid_argument("invalid metric name '" + name_ + "'");
  for (const auto& label : label_names_)
    if (!valid_label_name(label))
      throw std::invalid_argument("invalid label name '" + label + "' of " + name_);
}

void Family::check_arity(const LabelValues& values) const {
  if (values.size() != label_names_.size())
    throw std::invalid_argument(name_ + " has " + std::to_string(label_names_.size()) +
                                " labels, not " + std::to_string(values.size()));
}

template <class Metric>
MetricFamily<Metric>::MetricFamily(std::string name, std::string help,
                                   std::vector<std::string> label_names, std::vector<double> bounds)
    : Family(std::move(name), std::move(help), std::move(label_names)), bounds_(std::move(bounds)) {
  if constexpr (std::is_same_v<Metric, Histogram>) {
    if (std::ranges::find(label_names_, "le") != label_names_.end())
      throw std::invalid_argument("histogram " + name_ + " cannot have a label 'le'");
    for (std::size_t b = 0; b < bounds_.size(); ++b)
      if (!std::isfinite(bounds_[b]) || (b > 0 && bounds_[b] <= bounds_[b - 1]))
        throw std::invalid_argument("bucket bounds of " + name_ +
                                    " must be finite and strictly increasing");
  }
}

template <class Metric>
Metric& MetricFamily<Metric>::with(const LabelValues& values) {
  check_arity(values);
  MutexLock lock(mutex_);
  if constexpr (std::is_same_v<Metric, Histogram>)
    return series_.try_emplace(values, bounds_).first->second;
  else
    return series_.try_emplace(values).first->second;
}

template <class Metric>
void MetricFamily<Metric>::render(std::string& out, const std::string& constant) const {
  MutexLock lock(mutex_);
  if (series_.empty()) return;
  out += "# HELP " + name_ + ' ' + escape(help_, false) + '\n';
  out += "# TYPE " + name_ + ' ' + type_name<Metric>() + '\n';
  for (const auto& [values, metric] : series_)
    render_series(out, name_, constant, label_names_, values, metric);
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

namespace {

// The constant labels as label_set() puts them first: `a="x",b="y"`.
std::string render_constant(const Labels& labels) {
  std::string out;
  for (const auto& [name, value] : labels) {
    if (!valid_label_name(name))
      throw std::invalid_argument("invalid constant label name '" + name + "'");
    if (std::ranges::count(labels, name, &Labels::value_type::first) > 1)
      throw std::invalid_argument("constant label '" + name + "' is given twice");
    out += (out.empty() ? "" : ",") + label_pair(name, value);
  }
  return out;
}

}  // namespace

MetricsRegistry::MetricsRegistry(Labels constant_labels)
    : constant_labels_(std::move(constant_labels)), constant_(render_constant(constant_labels_)) {}

template <class Metric>
MetricFamily<Metric>& MetricsRegistry::add(std::unique_ptr<MetricFamily<Metric>> family) {
  for (const auto& [label, value] : constant_labels_)
    if (std::ranges::find(family->label_names(), label) != family->label_names().end())
      throw std::invalid_argument("label '" + label + "' of " + family->name() +
                                  " is one of the registry's constant labels");
  MutexLock lock(mutex_);
  for (const auto& f : families_)
    if (f->name() == family->name())
      throw std::invalid_argument("metric " + family->name() + " is already registered");
  auto& added = *family;
  families_.push_back(std::move(family));
  return added;
}

MetricFamily<Counter>& MetricsRegistry::counter(std::string name, std::string help,
                                                std::vector<std::string> label_names) {
  return add(std::make_unique<MetricFamily<Counter>>(std::move(name), std::move(help),
                                                     std::move(label_names)));
}

MetricFamily<Gauge>& MetricsRegistry::gauge(std::string name, std::string help,
                                            std::vector<std::string> label_names) {
  return add(std::make_unique<MetricFamily<Gauge>>(std::move(name), std::move(help),
                                                   std::move(label_names)));
}

MetricFamily<Histogram>& MetricsRegistry::histogram(std::string name, std::string help,
                                                    std::vector<double> bounds,
                                                    std::vector<std::string> label_names) {
  return add(std::make_unique<MetricFamily<Histogram>>(std::move(name), std::move(help),
                                                       std::move(label_names), std::move(bounds)));
}

std::string MetricsRegistry::prometheus_text() const {
  std::string out;
  MutexLock lock(mutex_);
  for (const auto& f : families_) f->render(out, constant_);
  return out;
}

std::vector<double> log_bounds(double lowest, double highest) {
  std::vector<double> bounds;
  for (int exponent = static_cast<int>(std::floor(std::log10(lowest)));; ++exponent) {
    // 10^-k is not a double, but dividing by 10^k (which is) rounds once.
    const double scale = std::pow(10.0, std::abs(exponent));
    for (const double mantissa : {1.0, 2.5, 5.0}) {
      const double bound = exponent < 0 ? mantissa / scale : mantissa * scale;
      if (bound > highest * (1 + 1e-12)) return bounds;
      if (bound >= lowest * (1 - 1e-12)) bounds.push_back(bound);
    }
  }
}

WindowedMean::WindowedMean(const Histogram& histogram) : histogram_(histogram) { take(); }

double WindowedMean::take() {
  const auto s = histogram_.snapshot();
  const double mean = s.count > count_ ? (s.sum - sum_) / static_cast<double>(s.count - count_) : 0;
  sum_ = s.sum;
  count_ = s.count;
  return mean;
}

}  // namespace pstrain
