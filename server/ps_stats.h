#pragma once
// The ps's statistics: the counters the request loop keeps, the chunk
// store's and coordinator's figures, and the JSON the stats op answers.
// Every figure lives in the role's MetricsRegistry (shared/metrics_registry.h),
// so the stats op and a Prometheus scrape read the same series.
//
// The JSON object's keys (tests and tools read them by name):
//   ps, requests (an object: count per op name), messages (received; each
//   holds one or more requests, shared/protocol.h), errors, malformed,
//   resends_answered, requests_too_old, fault_drops, nonfinite_refused, replies_dropped,
//   refused (requests whose key lacks the right, server/rights.h),
//   bytes_in, bytes_out, optimizer_seconds, updates, copies_on_write,
//   chunks, elements, version_sum, version_max, global_samples,
//   parked_barrier, parked_kv_get, parked_read (mode ssp), parked_gradient
//   (mode backup), updates_lost (per worker: acknowledged updates a restore
//   of this ps lost), ssp_staleness_max (mode ssp: the largest staleness in
//   steps of an applied update, server/consistency/ssp_gate.h), gradients_dropped (mode
//   backup: late gradients never applied, server/consistency/backup_aggregator.h),
//   replica_forwards, replication_pending, backup_losses, takeovers, unserved,
//   rejoins, handbacks (replication.replicas 2, server/replicator.h), uptime_seconds, tables (an
//   object per embedding table: rows, bytes, created, admission_dropped, evicted, expired,
//   rows_pulled, rows_pushed; server/table_store.h).
// `parked_*` count the requests waiting right now, so a test can see that a
// barrier or kv_get has arrived and is parked before it goes on.
//
// The series (Prometheus names; docs/metrics.md says what each means):
//   pstrain_ps_requests_total{op}, pstrain_ps_messages_total, pstrain_ps_errors_total,
//   pstrain_ps_malformed_requests_total, pstrain_ps_resends_answered_total,
//   pstrain_ps_requests_too_old_total, pstrain_ps_fault_drops_total,
//   pstrain_ps_nonfinite_refused_total, pstrain_ps_replies_dropped_total,
//   pstrain_ps_refused_total,
//   pstrain_ps_received_bytes_total{op}, pstrain_ps_sent_bytes_total{op}
//   (op "none": messages that are not a decodable request, and their replies),
//   pstrain_ps_updates_total,
//   pstrain_ps_copies_on_write_total, pstrain_ps_optimizer_seconds_total,
//   pstrain_ps_updates_lost_total{worker}, pstrain_ps_checkpoints_total,
//   pstrain_ps_gradients_dropped_total,
//   pstrain_ps_table_rows_created_total{table},
//   pstrain_ps_table_admission_dropped_total{table},
//   pstrain_ps_table_rows_evicted_total{table},
//   pstrain_ps_table_rows_expired_total{table},
//   pstrain_ps_table_rows_pulled_total{table},
//   pstrain_ps_table_rows_pushed_total{table},
//   pstrain_ps_replica_forwards_total, pstrain_ps_backup_losses_total,
//   pstrain_ps_takeovers_total, pstrain_ps_unserved_requests_total,
//   pstrain_ps_rejoins_total, pstrain_ps_handbacks_total;
//   the histograms pstrain_ps_request_seconds{op},
//   pstrain_ps_sparse_ids_per_request,
//   pstrain_ps_optimizer_apply_seconds, pstrain_ps_update_staleness,
//   pstrain_ps_checkpoint_seconds, pstrain_ps_ssp_staleness_steps,
//   pstrain_ps_replication_lag_seconds, pstrain_ps_rejoin_seconds;
//   and the gauges pstrain_ps_chunks, pstrain_ps_elements,
//   pstrain_ps_chunk_versions (not *_sum, which names a histogram's part),
//   pstrain_ps_version_max, pstrain_ps_global_samples,
//   pstrain_ps_parked_requests{wait}, pstrain_ps_workers{state},
//   pstrain_ps_worker_heartbeat_age_seconds{worker},
//   pstrain_ps_start_time_seconds, pstrain_ps_table_rows{table},
//   pstrain_ps_table_bytes{table}, pstrain_ps_replication_pending.
// The request loop's counters move with every request; the store's and the
// coordinator's figures are copied in by refresh(), because some of them
// (elements, version sums) are loops over every chunk, too dear per request.
//
// Thread rules: the counting calls and refresh() run on the ps thread, like
// the whole ps (server/request.h), except checkpoint_written(), which the
// checkpoint writer's thread calls; the registry may be read from any thread.
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/request.h"
#include "server/table_store.h"
#include "shared/metrics_registry.h"

namespace pstrain::ps {

class PsStats {
 public:
  // Registers this ps's series in `registry`, which must outlive the stats.
  PsStats(MetricsRegistry& registry, std::uint32_t ps_index);

  // A message in, every frame's bytes: of a decoded request's op, or none
  // for one that is not a decodable request.
  void received(std::optional<wire::Op> op, std::size_t bytes) {
    bytes_in_[op ? index_of(*op) : 0]->add(double(bytes));
  }
  // A frame out, of a reply to `op` (an undecodable request's has none).
  void sent(wire::Op op, std::size_t bytes) { bytes_out_[index_of(op)]->add(double(bytes)); }
  void message() { messages_.add(); }     // one received, of any number of requests
  void malformed() { malformed_.add(); }  // a message that is not a decodable request
  void request(wire::Op op) { requests_[index_of(op)]->add(); }  // decoded
  // A decoded request handled: from its receipt until its handler returned
  // (its reply sent, or the request parked).
  void handled(wire::Op op, double seconds) { request_seconds_[index_of(op)]->observe(seconds); }
  // A push applied: `staleness` updates to the chunk since the version its
  // sender last pulled, and the optimizer's time.
  void pushed(std::uint64_t staleness, double optimizer_seconds) {
    update_staleness_.observe(double(staleness));
    optimizer_apply_.observe(optimizer_seconds);
  }
  // A checkpoint written (server/checkpointer.h); from the writer's thread.
  void checkpoint_written(double seconds) {
    checkpoints_.add();
    checkpoint_seconds_.observe(seconds);
  }
  void error() { errors_.add(); }                      // a request answered with an error
  void resend_answered() { resends_answered_.add(); }  // from the record (server/dedup.h)
  void too_old() { too_old_.add(); }                   // a resend the record cannot tell about
  void fault_drop() { fault_drops_.add(); }            // a reply net.fault dropped
  void nonfinite_refused() { nonfinite_.add(); }       // an update with NaN or infinity
  void refused() { refused_.add(); }  // its CURVE key lacks the right (server/rights.h)
  // A reply the send budget had no room for (server/send_budget.h).
  void reply_dropped() { replies_dropped_.add(); }
  // Mode ssp: an update applied `steps` ahead of the slowest worker.
  void ssp_staleness(std::uint64_t steps);
  // Mode backup: a late gradient dropped.
  void gradient_dropped() { gradients_dropped_.add(); }
  // Replication (server/replicator.h): an update forwarded to the backup;
  // the backup's answer to one after `seconds`; the replies held for it now;
  // the backup given up on.
  void replica_forwarded() { replica_forwards_.add(); }
  void replica_acked(double seconds) { replication_lag_.observe(seconds); }
  void replication_pending(std::size_t replies) { replication_pending_.set(double(replies)); }
  void backup_lost() { backup_losses_.add(); }
  // Fail-over: this ps took over its primary's shard; a data request left
  // unanswered because this ps may not serve it now (a primary without a
  // lease from its backup, one whose backup took over, a backup whose
  // primary still lives).
  void took_over() { takeovers_.add(); }
  void unserved() { unserved_.add(); }
  // Re-join (server/replicator.h): a shard's state received whole (a
  // backup's copy made again, or a restarted primary's shard handed back);
  // a shard handed back by this ps.
  void rejoined() { rejoins_.add(); }
  // The shard's state this ps asked for (a restart) or sent (a copy to a
  // returning backup) was installed `seconds` after the ping.
  void rejoin_took(double seconds) { rejoin_seconds_.observe(seconds); }
  void handed_back() { handbacks_.add(); }
  // A sparse request's ids (unique, sorted).
  void sparse_ids(std::size_t ids) { sparse_ids_.observe(double(ids)); }
  // Reads (ssp) and gradients' replies (backup) held right now.
  void held(std::size_t reads, std::size_t gradients);

  // Copies the store's and the coordinator's figures into their series;
  // heartbeat ages are as of `now`.
  void refresh(const ChunkStore& store, const TableStore& tables,
               const Coordinator::Figures& coordinator, Clock::time_point now);

  // The stats op's JSON, from the series as the last refresh() left them.
  std::string json(double now_unix) const;

  // Registers the stats op: refresh(), then answer json().
  void add_handler(Handlers& handlers, ReplySink& sink, const ChunkStore& store,
                   const TableStore& tables, const Coordinator& coordinator);

 private:
  // A series per op: [op] for each op, [0] for none (or unused).
  template <class Metric>
  using ByOp = std::array<Metric*, wire::kMaxOp + 1>;
  template <class Metric>
  static ByOp<Metric> by_op(MetricFamily<Metric>& family, bool none);
  // An op's place in a ByOp; 0 for a value that names no op.
  static std::size_t index_of(wire::Op op) {
    const auto i = static_cast<std::size_t>(op);
    return i <= wire::kMaxOp ? i : 0;
  }
  // The sum of a counter per op, as the stats op's JSON shows it.
  static double total(const ByOp<Counter>& counters);

  std::uint32_t ps_index_;
  ByOp<Counter> requests_;  // [0] unused
  Counter& errors_;
  Counter& messages_;
  Counter& malformed_;
  Counter& resends_answered_;
  Counter& too_old_;
  Counter& fault_drops_;
  Counter& nonfinite_;
  Counter& refused_;
  Counter& replies_dropped_;
  ByOp<Counter> bytes_in_;
  ByOp<Counter> bytes_out_;
  ByOp<Histogram> request_seconds_;  // [0] unused
  Histogram& update_staleness_;
  Histogram& optimizer_apply_;
  Counter& checkpoints_;
  Histogram& checkpoint_seconds_;
  Counter& updates_;
  Counter& copies_on_write_;
  Counter& optimizer_seconds_;
  Gauge& chunks_;
  Gauge& elements_;
  Gauge& version_sum_;
  Gauge& version_max_;
  Gauge& global_samples_;
  MetricFamily<Gauge>& parked_;  // by what the requests wait in
  Gauge& parked_barrier_;
  Gauge& parked_kv_get_;
  Gauge& parked_read_;
  Gauge& parked_gradient_;
  Histogram& ssp_staleness_;
  Gauge& ssp_staleness_max_;
  Counter& gradients_dropped_;
  Counter& replica_forwards_;
  Histogram& replication_lag_;
  Gauge& replication_pending_;
  Counter& backup_losses_;
  Counter& takeovers_;
  Counter& rejoins_;
  Counter& handbacks_;
  Histogram& rejoin_seconds_;
  Counter& unserved_;
  MetricFamily<Counter>& updates_lost_;  // by worker
  std::size_t workers_ = 0;              // updates_lost_'s series, as of refresh()
  MetricFamily<Gauge>& workers_by_state_;
  MetricFamily<Gauge>& heartbeat_age_;  // by worker
  Gauge& start_time_;
  Histogram& sparse_ids_;
  MetricFamily<Gauge>& table_rows_;  // by table, like the rest
  MetricFamily<Gauge>& table_bytes_;
  MetricFamily<Counter>& table_created_;
  MetricFamily<Counter>& table_admission_dropped_;
  MetricFamily<Counter>& table_evicted_;
  MetricFamily<Counter>& table_expired_;
  MetricFamily<Counter>& table_pulled_;
  MetricFamily<Counter>& table_pushed_;
  std::vector<TableFigures> tables_;  // as of refresh(), for json()
};

}  // namespace pstrain::ps
