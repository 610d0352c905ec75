// The ps's statistics: the stats op's JSON and the Prometheus series read
// the same registry, and the store's figures arrive through refresh().
#include <doctest/doctest.h>

#include <vector>

#include "server/ps_stats.h"
#include "shared/metrics.h"

using namespace pstrain;
using namespace pstrain::ps;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("ps stats: request counters and store figures in both the JSON and the registry") {
  MetricsRegistry registry;
  PsStats stats(registry, 3);
  ChunkStore store(OptimizerConfig{});
  const std::vector<float> values(10, 1.0f), grad(10, 0.5f);
  store.init("w", 0, values);
  store.init("w", 1, values);
  store.push("w", 0, grad);
  store.push("w", 0, grad);
  store.push("w", 1, grad);
  for (int i = 0; i < 3; ++i) stats.request(wire::Op::pull);
  stats.request(wire::Op::push);
  stats.error();
  stats.malformed();
  stats.resend_answered();
  stats.resend_answered();
  stats.too_old();
  stats.fault_drop();
  stats.received(100);
  stats.sent(40);
  stats.sent(2);
  stats.refresh(store, {.global_samples = 640,
                        .parked_barrier = 2,
                        .parked_kv_get = 1,
                        .updates_lost = {0, 7}});

  const auto json = stats.json(unix_time());
  CHECK(json.starts_with("{\"ps\":3,\"requests\":{\"hello\":0,"));
  for (const auto* part :
       {"\"pull\":3", "\"push\":1", "\"errors\":1", "\"malformed\":1", "\"bytes_in\":100",
        "\"resends_answered\":2", "\"requests_too_old\":1", "\"fault_drops\":1",
        "\"bytes_out\":42", "\"updates\":3", "\"chunks\":2", "\"elements\":20",
        "\"version_sum\":3", "\"version_max\":2", "\"global_samples\":640",
        "\"parked_barrier\":2", "\"parked_kv_get\":1", "\"updates_lost\":[0,7]"})
    CHECK_MESSAGE(contains(json, part), part, " in ", json);

  const auto text = registry.prometheus_text();
  for (const auto* line :
       {"pstrain_ps_requests_total{op=\"pull\"} 3\n", "pstrain_ps_requests_total{op=\"hello\"} 0\n",
        "pstrain_ps_errors_total 1\n", "pstrain_ps_resends_answered_total 2\n",
        "pstrain_ps_requests_too_old_total 1\n", "pstrain_ps_fault_drops_total 1\n",
        "pstrain_ps_received_bytes_total 100\n",
        "pstrain_ps_sent_bytes_total 42\n", "pstrain_ps_updates_total 3\n",
        "pstrain_ps_elements 20\n", "pstrain_ps_global_samples 640\n",
        "pstrain_ps_parked_requests{wait=\"barrier\"} 2\n",
        "pstrain_ps_updates_lost_total{worker=\"1\"} 7\n"})
    CHECK_MESSAGE(contains(text, line), line, " in\n", text);

  // A second refresh adds only what accrued since the first.
  store.push("w", 1, grad);
  stats.refresh(store, {.global_samples = 700,
                        .parked_barrier = 0,
                        .parked_kv_get = 0,
                        .updates_lost = {0, 9}});
  CHECK(contains(registry.prometheus_text(), "pstrain_ps_updates_total 4\n"));
  CHECK(contains(stats.json(unix_time()), "\"updates\":4,"));
  CHECK(contains(stats.json(unix_time()), "\"parked_barrier\":0,"));
  CHECK(contains(registry.prometheus_text(), "pstrain_ps_updates_lost_total{worker=\"1\"} 9\n"));
}
