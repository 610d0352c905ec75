// The metrics registry: its exact Prometheus text, bucket boundaries,
// exact sums under concurrent updates, and the windowed figures the JSONL
// lines are made of.
#include <doctest/doctest.h>

#include <barrier>
#include <cmath>
#include <thread>
#include <vector>

#include "shared/metrics_registry.h"

using namespace pstrain;

TEST_SUITE_BEGIN("metrics");

TEST_CASE("metrics registry: Prometheus text of a counter, a gauge and a histogram") {
  MetricsRegistry registry;
  auto& requests = registry.counter("pstrain_requests_total", "Requests handled, by op.", {"op"});
  auto& samples = registry.gauge("pstrain_global_samples", "Samples all workers trained on.");
  auto& wait =
      registry.histogram("pstrain_wait_seconds", "Wait per request.", {0.25, 0.5, 1}, {"op"});
  registry.gauge("pstrain_unused", "A family without series is left out.", {"x"});
  requests.with({"push"}).add(2);
  requests.with({"pull"}).add();
  samples.with().set(1.5);
  for (double v : {0.125, 0.5, 2.0}) wait.with({"pull"}).observe(v);

  CHECK(registry.prometheus_text() ==
        "# HELP pstrain_requests_total Requests handled, by op.\n"
        "# TYPE pstrain_requests_total counter\n"
        "pstrain_requests_total{op=\"pull\"} 1\n"
        "pstrain_requests_total{op=\"push\"} 2\n"
        "# HELP pstrain_global_samples Samples all workers trained on.\n"
        "# TYPE pstrain_global_samples gauge\n"
        "pstrain_global_samples 1.5\n"
        "# HELP pstrain_wait_seconds Wait per request.\n"
        "# TYPE pstrain_wait_seconds histogram\n"
        "pstrain_wait_seconds_bucket{op=\"pull\",le=\"0.25\"} 1\n"
        "pstrain_wait_seconds_bucket{op=\"pull\",le=\"0.5\"} 2\n"
        "pstrain_wait_seconds_bucket{op=\"pull\",le=\"1\"} 2\n"
        "pstrain_wait_seconds_bucket{op=\"pull\",le=\"+Inf\"} 3\n"
        "pstrain_wait_seconds_sum{op=\"pull\"} 2.625\n"
        "pstrain_wait_seconds_count{op=\"pull\"} 3\n");
}

TEST_CASE("metrics registry: label values and help text are escaped") {
  MetricsRegistry registry;
  registry.counter("pstrain_errors_total", "Errors by \"kind\"; a \\ and a\nnewline.", {"kind"})
      .with({"a\"b\\c\nd"})
      .add();
  CHECK(registry.prometheus_text() ==
        "# HELP pstrain_errors_total Errors by \"kind\"; a \\\\ and a\\nnewline.\n"
        "# TYPE pstrain_errors_total counter\n"
        "pstrain_errors_total{kind=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST_CASE("metrics registry: a value equal to a bound counts into that bound's bucket") {
  MetricsRegistry registry;
  auto& h = registry.histogram("pstrain_values", "Values.", {1, 2, 3}).with();
  for (double v : {-5.0, 1.0, std::nextafter(2.0, 3.0), 3.0, 4.0, std::nan("")}) h.observe(v);
  const auto s = h.snapshot();
  CHECK(s.cumulative == std::vector<std::uint64_t>{2, 2, 4, 6});  // NaN goes to +Inf
  CHECK(s.count == 6);
}

TEST_CASE("metrics registry: concurrent updates sum exactly") {
  MetricsRegistry registry;
  auto& counters = registry.counter("pstrain_events_total", "Events.", {"kind"});
  auto& gauge = registry.gauge("pstrain_level", "Level.").with();
  auto& histogram = registry.histogram("pstrain_sizes", "Sizes.", {1, 10}).with();
  constexpr int kThreads = 8, kUpdates = 500000;
  constexpr std::uint64_t kTotal = kThreads * kUpdates;
  std::barrier together(kThreads);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        // Every loop starts in all threads at once, so the updates overlap
        // rather than run one thread after another; every thread looks the
        // series up, so its creation races too.
        together.arrive_and_wait();
        auto& counter = counters.with({"shared"});
        for (int i = 0; i < kUpdates; ++i) counter.add();
        together.arrive_and_wait();
        for (int i = 0; i < kUpdates; ++i) gauge.add(2);
        together.arrive_and_wait();
        for (int i = 0; i < kUpdates; ++i) histogram.observe(i % 2 ? 1 : 5);
      });
  }
  CHECK(counters.with({"shared"}).value() == kTotal);
  CHECK(gauge.value() == 2.0 * kTotal);
  const auto s = histogram.snapshot();
  CHECK(s.count == kTotal);
  CHECK(s.cumulative[0] == kTotal / 2);
  CHECK(s.sum == 3.0 * kTotal);
}

TEST_CASE("metrics registry: windowed mean and max between two reports") {
  MetricsRegistry registry;
  auto& h = registry.histogram("pstrain_step_seconds", "Step time.", {1}).with();
  auto& max = registry.gauge("pstrain_step_seconds_window_max", "Largest step time.").with();
  h.observe(7);  // before the window
  WindowedMean mean(h);
  for (double v : {1.0, 2.0, 6.0}) {
    h.observe(v);
    max.raise(v);
  }
  CHECK(mean.take() == 3);
  CHECK(max.reset() == 6);
  h.observe(0.5);
  max.raise(0.5);
  CHECK(mean.take() == 0.5);
  CHECK(max.reset() == 0.5);
  CHECK(mean.take() == 0);  // an empty window
  CHECK(max.value() == 0);
}

TEST_CASE("metrics registry: invalid registrations and updates are refused") {
  MetricsRegistry registry;
  auto& counter = registry.counter("pstrain_ok_total", "Fine.", {"op"});
  CHECK_THROWS_AS(registry.gauge("pstrain_ok_total", "Taken."), std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("2bad", "Digit first."), std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("pstrain_x_total", "Bad label.", {"a-b"}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.counter("pstrain_y_total", "Reserved.", {"__op"}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.histogram("pstrain_h", "le is the bucket's.", {1}, {"le"}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.histogram("pstrain_h", "Not increasing.", {1, 1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(registry.histogram("pstrain_h", "Not finite.", {1, INFINITY}),
                  std::invalid_argument);
  CHECK_THROWS_AS(counter.with({}), std::invalid_argument);
  CHECK_THROWS_AS(counter.with({"pull"}).add(-1), std::invalid_argument);
}

TEST_CASE("metrics registry: constant labels come first on every series, buckets included") {
  MetricsRegistry registry(Labels{{"job", "a\"b"}, {"role", "ps"}});
  registry.gauge("pstrain_level", "Level.").with().set(2);
  registry.histogram("pstrain_wait_seconds", "Wait.", {1}, {"op"}).with({"pull"}).observe(0.5);
  CHECK(registry.prometheus_text() ==
        "# HELP pstrain_level Level.\n"
        "# TYPE pstrain_level gauge\n"
        "pstrain_level{job=\"a\\\"b\",role=\"ps\"} 2\n"
        "# HELP pstrain_wait_seconds Wait.\n"
        "# TYPE pstrain_wait_seconds histogram\n"
        "pstrain_wait_seconds_bucket{job=\"a\\\"b\",role=\"ps\",op=\"pull\",le=\"1\"} 1\n"
        "pstrain_wait_seconds_bucket{job=\"a\\\"b\",role=\"ps\",op=\"pull\",le=\"+Inf\"} 1\n"
        "pstrain_wait_seconds_sum{job=\"a\\\"b\",role=\"ps\",op=\"pull\"} 0.5\n"
        "pstrain_wait_seconds_count{job=\"a\\\"b\",role=\"ps\",op=\"pull\"} 1\n");
  // A family cannot reuse a constant label's name; constant labels are valid
  // and distinct.
  CHECK_THROWS_AS(registry.counter("pstrain_x_total", "Clash.", {"role"}), std::invalid_argument);
  CHECK_THROWS_AS(MetricsRegistry(Labels{{"job", "a"}, {"job", "b"}}), std::invalid_argument);
  CHECK_THROWS_AS(MetricsRegistry(Labels{{"__name__", "a"}}), std::invalid_argument);
}

TEST_CASE("metrics registry: log bounds are 1, 2.5 and 5 per decade, rendered as written") {
  CHECK(log_bounds(1e-4, 10) == std::vector<double>{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
                                                    0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  CHECK(log_bounds(2.5, 50) == std::vector<double>{2.5, 5, 10, 25, 50});
  MetricsRegistry registry;
  registry.histogram("pstrain_t_seconds", "T.", log_bounds(2.5e-5, 2.5e-5)).with();
  CHECK(registry.prometheus_text().find("le=\"2.5e-05\"") != std::string::npos);
}

TEST_SUITE_END();
