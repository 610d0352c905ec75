#pragma once
// One registry for a process role's counters, gauges and histograms. The
// JSON-lines metrics (shared/metrics.h) take their windowed figures from it,
// and it renders itself in the Prometheus text exposition format 0.0.4 for
// a scrape endpoint.
//
// Names follow Prometheus' conventions: a `pstrain_` prefix, `_total` on
// counters, base units (seconds, bytes) in the name's last word. A family is
// a name, a help text and a fixed list of label names; each distinct list
// of label values is one series, e.g. pstrain_ps_requests_total{op="pull"}.
// A registry may also have constant labels, which it puts first on every
// series it renders: a process's job, role and index, so that its series
// say whose they are to any scraper (shared/metrics_server.h).
//
// Thread rules:
// - Registration (MetricsRegistry::counter/gauge/histogram) belongs to a
//   role's setup; it is safe at any time, but a name registers only once.
// - MetricFamily::with() may be called from any thread; the reference it
//   returns lives as long as the registry, so hot paths look a series up
//   once and keep the reference.
// - Counter and Gauge updates are lock-free atomics. Histogram updates take
//   the histogram's own mutex, so a snapshot's buckets, sum and count always
//   agree with each other.
// - Rendering may run concurrently with updates; it sees each series at
//   some moment during the call.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shared/thread_annotations.h"

namespace pstrain {

// The values of a series' labels, in the order of its family's label names.
using LabelValues = std::vector<std::string>;
// Label names with their values, in order.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A count that only goes up (requests, bytes, samples).
class Counter {
 public:
  // Throws std::invalid_argument when `amount` is negative or NaN.
  void add(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (the global sample count, a window's max).
class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void add(double delta);
  // Raises the value to `value` when that is larger.
  void raise(double value);
  // Sets the value to 0 and returns the one it had: what a "max since the
  // last report" gauge does at each report.
  double reset() { return value_.exchange(0, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into buckets with fixed upper bounds, plus their sum
// and count, like a Prometheus histogram: a value equal to a bound counts
// into that bound's bucket; the last bucket (+Inf) takes the rest, NaN too.
class Histogram {
 public:
  struct Snapshot {
    std::vector<std::uint64_t> cumulative;  // per bound, then +Inf (= count)
    double sum = 0;
    std::uint64_t count = 0;
  };

  // `bounds`: strictly increasing and finite (the family checks); they must
  // outlive the histogram.
  explicit Histogram(std::span<const double> bounds);
  void observe(double value);
  Snapshot snapshot() const;
  std::span<const double> bounds() const { return bounds_; }

 private:
  const std::span<const double> bounds_;
  mutable Mutex mutex_;
  std::vector<std::uint64_t> counts_ GUARDED_BY(mutex_);  // per bucket, not cumulative
  double sum_ GUARDED_BY(mutex_) = 0;
};

// What every family has: identity and rendering.
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names);
  virtual ~Family() = default;
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Appends HELP, TYPE and every series' samples, each with `constant`
  // (rendered labels, `a="x",b="y"`, or empty) before its own labels;
  // nothing when the family has no series yet.
  virtual void render(std::string& out, const std::string& constant) const = 0;

 protected:
  // Throws std::invalid_argument unless there is one value per label name.
  void check_arity(const LabelValues& values) const;

  const std::string name_, help_;
  const std::vector<std::string> label_names_;
};

// The series of one counter, gauge or histogram family, by label values.
template <class Metric>
class MetricFamily final : public Family {
 public:
  MetricFamily(std::string name, std::string help, std::vector<std::string> label_names,
               std::vector<double> bounds = {});

  // The series with these label values, created at its first use. An
  // unlabelled family has one series: with().
  Metric& with(const LabelValues& values = {});
  void render(std::string& out, const std::string& constant) const override;

 private:
  const std::vector<double> bounds_;  // histograms only
  mutable Mutex mutex_;
  // Node-based, so references handed out stay valid; sorted, so the
  // rendering is stable.
  std::map<LabelValues, Metric> series_ GUARDED_BY(mutex_);
};

class MetricsRegistry {
 public:
  // Throws std::invalid_argument when a constant label's name is invalid
  // or given twice.
  explicit MetricsRegistry(Labels constant_labels = {});

  // Each throws std::invalid_argument when the name is taken or is not a
  // valid Prometheus name, or a label name is invalid (or "le" on a
  // histogram, or one of the constant labels), or histogram bounds are not
  // strictly increasing and finite.
  MetricFamily<Counter>& counter(std::string name, std::string help,
                                 std::vector<std::string> label_names = {});
  MetricFamily<Gauge>& gauge(std::string name, std::string help,
                             std::vector<std::string> label_names = {});
  MetricFamily<Histogram>& histogram(std::string name, std::string help, std::vector<double> bounds,
                                     std::vector<std::string> label_names = {});

  // Every family in registration order, in the text exposition format 0.0.4
  // (Content-Type: text/plain; version=0.0.4).
  std::string prometheus_text() const;

 private:
  template <class Metric>
  MetricFamily<Metric>& add(std::unique_ptr<MetricFamily<Metric>> family);

  const Labels constant_labels_;
  const std::string constant_;  // constant_labels_ rendered, escaped
  mutable Mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_ GUARDED_BY(mutex_);
};

// Histogram bounds 1, 2.5 and 5 times each power of ten from `lowest` up to
// `highest` (both such values, e.g. 1e-4 and 10): durations from a tenth of
// a millisecond to seconds in 16 buckets. Each bound is the double nearest
// its decimal value, so it renders as written (le="0.00025").
std::vector<double> log_bounds(double lowest, double highest);

// The mean of a histogram's observations since the previous take(), from
// the differences of its sum and count: a JSONL metrics line shows a figure
// as its mean over the window since the line before.
class WindowedMean {
 public:
  // The first window starts now.
  explicit WindowedMean(const Histogram& histogram);
  // 0 when nothing was observed in the window.
  double take();

 private:
  const Histogram& histogram_;
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

}  // namespace pstrain
