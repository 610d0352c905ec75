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
  TableSpec emb{"emb", 4, std::nullopt};
  emb.admit_after = 1;
  TableStore tables({emb}, RowOptimizerConfig{}, {.seed = 1});
  const std::vector<std::uint64_t> keys{1, 2, 3};
  std::vector<float> rows(12, 0.5f);
  tables.update("emb", keys, rows, 100);  // dropped: not yet admitted
  tables.update("emb", keys, rows, 100);  // creates all three
  tables.read("emb", keys, rows);
  for (int i = 0; i < 3; ++i) stats.request(wire::Op::pull);
  stats.request(wire::Op::push);
  stats.error();
  stats.malformed();
  stats.message();
  stats.message();
  stats.resend_answered();
  stats.resend_answered();
  stats.too_old();
  stats.fault_drop();
  stats.received(wire::Op::push, 90);
  stats.received(std::nullopt, 10);
  stats.sent(wire::Op::push, 40);
  stats.sent(wire::Op::pull, 2);
  const auto now = Clock::now();
  stats.refresh(store, tables,
                {.global_samples = 640,
                 .parked_barrier = 2,
                 .parked_kv_get = 1,
                 .updates_lost = {0, 7},
                 .workers = {{"live", now - std::chrono::milliseconds(1500)},
                             {"done", now - std::chrono::seconds(9)},
                             {"absent", now - std::chrono::seconds(30)},
                             {"pending", std::nullopt}}},
                now);

  const auto json = stats.json(unix_time());
  CHECK(json.starts_with("{\"ps\":3,\"requests\":{\"hello\":0,"));
  for (const auto* part : {"\"pull\":3",
                           "\"push\":1",
                           "\"errors\":1",
                           "\"messages\":2",
                           "\"malformed\":1",
                           "\"bytes_in\":100",
                           "\"resends_answered\":2",
                           "\"requests_too_old\":1",
                           "\"fault_drops\":1",
                           "\"bytes_out\":42",
                           "\"updates\":3",
                           "\"chunks\":2",
                           "\"elements\":20",
                           "\"version_sum\":3",
                           "\"version_max\":2",
                           "\"global_samples\":640",
                           "\"parked_barrier\":2",
                           "\"parked_kv_get\":1",
                           "\"updates_lost\":[0,7]",
                           "\"tables\":{\"emb\":{\"rows\":3,\"bytes\":",
                           "\"created\":3,\"admission_dropped\":3,",
                           "\"rows_pulled\":3,\"rows_pushed\":3}"})
    CHECK_MESSAGE(contains(json, part), part, " in ", json);

  const auto text = registry.prometheus_text();
  for (const auto* line : {"pstrain_ps_requests_total{op=\"pull\"} 3\n",
                           "pstrain_ps_requests_total{op=\"hello\"} 0\n",
                           "pstrain_ps_errors_total 1\n",
                           "pstrain_ps_resends_answered_total 2\n",
                           "pstrain_ps_requests_too_old_total 1\n",
                           "pstrain_ps_fault_drops_total 1\n",
                           "pstrain_ps_received_bytes_total{op=\"push\"} 90\n",
                           "pstrain_ps_received_bytes_total{op=\"none\"} 10\n",
                           "pstrain_ps_received_bytes_total{op=\"pull\"} 0\n",
                           "pstrain_ps_sent_bytes_total{op=\"push\"} 40\n",
                           "pstrain_ps_sent_bytes_total{op=\"pull\"} 2\n",
                           "pstrain_ps_updates_total 3\n",
                           "pstrain_ps_workers{state=\"live\"} 1\n",
                           "pstrain_ps_workers{state=\"pending\"} 1\n",
                           "pstrain_ps_worker_heartbeat_age_seconds{worker=\"0\"} 1.5\n",
                           "pstrain_ps_worker_heartbeat_age_seconds{worker=\"1\"} NaN\n",
                           "pstrain_ps_worker_heartbeat_age_seconds{worker=\"2\"} 30\n",
                           "pstrain_ps_worker_heartbeat_age_seconds{worker=\"3\"} NaN\n",
                           "pstrain_ps_elements 20\n",
                           "pstrain_ps_global_samples 640\n",
                           "pstrain_ps_parked_requests{wait=\"barrier\"} 2\n",
                           "pstrain_ps_updates_lost_total{worker=\"1\"} 7\n",
                           "pstrain_ps_table_rows{table=\"emb\"} 3\n",
                           "pstrain_ps_table_rows_created_total{table=\"emb\"} 3\n",
                           "pstrain_ps_table_admission_dropped_total{table=\"emb\"} 3\n",
                           "pstrain_ps_table_rows_pulled_total{table=\"emb\"} 3\n"})
    CHECK_MESSAGE(contains(text, line), line, " in\n", text);

  // A second refresh adds only what accrued since the first.
  store.push("w", 1, grad);
  stats.refresh(store, tables,
                {.global_samples = 700,
                 .parked_barrier = 0,
                 .parked_kv_get = 0,
                 .updates_lost = {0, 9},
                 .workers = {}},
                Clock::now());
  CHECK(contains(registry.prometheus_text(), "pstrain_ps_updates_total 4\n"));
  CHECK(contains(stats.json(unix_time()), "\"updates\":4,"));
  CHECK(contains(stats.json(unix_time()), "\"parked_barrier\":0,"));
  CHECK(contains(registry.prometheus_text(), "pstrain_ps_updates_lost_total{worker=\"1\"} 9\n"));
}

TEST_CASE("ps stats: request times by op, push staleness, optimizer and checkpoint times") {
  MetricsRegistry registry;
  PsStats stats(registry, 0);
  stats.handled(wire::Op::push_pull, 3e-5);
  stats.handled(wire::Op::push_pull, 0.002);
  stats.pushed(0, 1e-4);
  stats.pushed(3, 2e-4);
  stats.pushed(300, 3e-4);
  stats.checkpoint_written(0.5);
  const auto text = registry.prometheus_text();
  for (const auto* line :
       {"pstrain_ps_request_seconds_bucket{op=\"push_pull\",le=\"2.5e-05\"} 0\n",
        "pstrain_ps_request_seconds_bucket{op=\"push_pull\",le=\"5e-05\"} 1\n",
        "pstrain_ps_request_seconds_bucket{op=\"push_pull\",le=\"0.0025\"} 2\n",
        "pstrain_ps_request_seconds_count{op=\"push_pull\"} 2\n",
        "pstrain_ps_request_seconds_count{op=\"pull\"} 0\n",
        "pstrain_ps_update_staleness_bucket{le=\"0\"} 1\n",
        "pstrain_ps_update_staleness_bucket{le=\"4\"} 2\n",
        "pstrain_ps_update_staleness_bucket{le=\"256\"} 2\n",
        "pstrain_ps_update_staleness_bucket{le=\"+Inf\"} 3\n",
        "pstrain_ps_update_staleness_sum 303\n", "pstrain_ps_optimizer_apply_seconds_count 3\n",
        "pstrain_ps_checkpoints_total 1\n", "pstrain_ps_checkpoint_seconds_sum 0.5\n"})
    CHECK_MESSAGE(contains(text, line), line, " in\n", text);
}
