#include "server/ps_stats.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <string_view>

#include "shared/messages.h"
#include "shared/metrics.h"

namespace pstrain::ps {
namespace {

// Counters mirror monotonic figures kept elsewhere (the chunk store's) by
// adding what has accrued since the last refresh.
void catch_up(Counter& counter, double total) {
  if (total > counter.value()) counter.add(total - counter.value());
}

std::uint64_t whole(double v) { return static_cast<std::uint64_t>(v); }

// Request handling takes microseconds; a parked request's handler returns
// at once too, so the tail is a slow optimizer step or a stalled host.
const std::vector<double> kRequestSeconds = log_bounds(1e-5, 1);
// Updates between a pull and its push: 0 with one worker, about the number
// of other workers in steady async training, far more behind a straggler.
const std::vector<double> kStaleness = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
// Checkpoints: a few MB in milliseconds to gigabytes in a minute.
const std::vector<double> kCheckpointSeconds = log_bounds(1e-3, 100);

constexpr const char* kWorkerStates[] = {"pending", "live", "absent", "done"};

}  // namespace

template <class Metric>
PsStats::ByOp<Metric> PsStats::by_op(MetricFamily<Metric>& family, bool none) {
  ByOp<Metric> series{};
  if (none) series[0] = &family.with({"none"});
  // Every op's series exists from the start, so a scrape shows zeros
  // rather than missing series.
  for (std::uint8_t op = 1; op <= wire::kMaxOp; ++op)
    series[op] = &family.with({std::string(wire::to_string(static_cast<wire::Op>(op)))});
  return series;
}

double PsStats::total(const ByOp<Counter>& counters) {
  double sum = 0;
  for (const auto* c : counters)
    if (c) sum += c->value();
  return sum;
}

PsStats::PsStats(MetricsRegistry& r, std::uint32_t ps_index)
    : ps_index_(ps_index),
      requests_(
          by_op(r.counter("pstrain_ps_requests_total", "Decoded requests, by op.", {"op"}), false)),
      errors_(r.counter("pstrain_ps_errors_total", "Requests answered with an error.").with()),
      messages_(r.counter("pstrain_ps_messages_total",
                          "Messages received; each holds one or more requests.")
                    .with()),
      malformed_(r.counter("pstrain_ps_malformed_requests_total",
                           "Messages that were not a decodable request.")
                     .with()),
      resends_answered_(
          r.counter("pstrain_ps_resends_answered_total",
                    "Resent updates answered from the record instead of applied again.")
              .with()),
      too_old_(
          r.counter("pstrain_ps_requests_too_old_total",
                    "Resends too old for the record to tell whether they were applied; refused.")
              .with()),
      fault_drops_(r.counter("pstrain_ps_fault_drops_total",
                             "Replies dropped by fault injection (net.fault.drop, for tests).")
                       .with()),
      nonfinite_(r.counter("pstrain_ps_nonfinite_refused_total",
                           "Pushes and assigns refused for NaN or infinite values; nothing stored.")
                     .with()),
      refused_(r.counter("pstrain_ps_refused_total",
                         "Requests refused because the sender's CURVE key lacks the right "
                         "(security.curve).")
                   .with()),
      replies_dropped_(r.counter("pstrain_ps_replies_dropped_total",
                                 "Replies not sent: their peer (or all peers) had the send "
                                 "budget's bytes of replies queued and unread.")
                           .with()),
      bytes_in_(by_op(r.counter("pstrain_ps_received_bytes_total",
                                "Bytes of every frame received, by the request's op (none: not "
                                "a decodable request).",
                                {"op"}),
                      true)),
      bytes_out_(by_op(r.counter("pstrain_ps_sent_bytes_total",
                                 "Bytes of every frame sent, by the op replied to (none: the "
                                 "reply to an undecodable request).",
                                 {"op"}),
                       true)),
      request_seconds_(by_op(r.histogram("pstrain_ps_request_seconds",
                                         "Time from a request's receipt until its handler "
                                         "returned (reply sent, or the request parked), by op.",
                                         kRequestSeconds, {"op"}),
                             false)),
      update_staleness_(r.histogram("pstrain_ps_update_staleness",
                                    "Updates applied to a chunk between the version a push's "
                                    "sender last pulled and the push.",
                                    kStaleness)
                            .with()),
      optimizer_apply_(r.histogram("pstrain_ps_optimizer_apply_seconds",
                                   "Time applying the optimizer to one pushed chunk.",
                                   kRequestSeconds)
                           .with()),
      checkpoints_(r.counter("pstrain_ps_checkpoints_total", "Checkpoints written.").with()),
      checkpoint_seconds_(r.histogram("pstrain_ps_checkpoint_seconds",
                                      "Time writing one checkpoint (serialize, CRC, write, "
                                      "rename), on the writer's thread.",
                                      kCheckpointSeconds)
                              .with()),
      updates_(
          r.counter("pstrain_ps_updates_total", "Pushes and assigns applied to chunks.").with()),
      copies_on_write_(r.counter("pstrain_ps_copies_on_write_total",
                                 "Updates that copied a chunk a pull still held.")
                           .with()),
      optimizer_seconds_(
          r.counter("pstrain_ps_optimizer_seconds_total", "Time spent applying the optimizer.")
              .with()),
      chunks_(r.gauge("pstrain_ps_chunks", "Chunks this ps holds.").with()),
      elements_(r.gauge("pstrain_ps_elements", "Values in this ps's chunks.").with()),
      version_sum_(r.gauge("pstrain_ps_chunk_versions",
                           "Sum of the chunks' versions: the updates they hold.")
                       .with()),
      version_max_(r.gauge("pstrain_ps_version_max", "Highest chunk version.").with()),
      global_samples_(r.gauge("pstrain_ps_global_samples",
                              "Samples all workers have trained on, as counted by this ps.")
                          .with()),
      parked_(r.gauge("pstrain_ps_parked_requests", "Requests waiting right now, by what for.",
                      {"wait"})),
      parked_barrier_(parked_.with({"barrier"})),
      parked_kv_get_(parked_.with({"kv_get"})),
      parked_read_(parked_.with({"read"})),
      parked_gradient_(parked_.with({"gradient"})),
      ssp_staleness_(r.histogram("pstrain_ps_ssp_staleness_steps",
                                 "Mode ssp: steps the pusher of an applied update was ahead of "
                                 "the slowest worker.",
                                 {0, 1, 2, 3, 4, 6, 8, 16, 32, 64})
                         .with()),
      ssp_staleness_max_(r.gauge("pstrain_ps_ssp_staleness_max_steps",
                                 "Mode ssp: the largest staleness of an applied update so far.")
                             .with()),
      gradients_dropped_(r.counter("pstrain_ps_gradients_dropped_total",
                                   "Mode backup: gradients that arrived after their step was "
                                   "applied; never applied.")
                             .with()),
      replica_forwards_(r.counter("pstrain_ps_replica_forwards_total",
                                  "Updates forwarded to this ps's backup (replication.replicas 2).")
                            .with()),
      replication_lag_(r.histogram("pstrain_ps_replication_lag_seconds",
                                   "Time from forwarding an update to the backup until the backup "
                                   "had applied it (the acknowledgement's wait).",
                                   kRequestSeconds)
                           .with()),
      replication_pending_(r.gauge("pstrain_ps_replication_pending",
                                   "Replies held until the backup applies their updates.")
                               .with()),
      backup_losses_(r.counter("pstrain_ps_backup_losses_total",
                               "Times this ps served on without its backup (silent for "
                               "replication.backup_silence, or refusing a forwarded update).")
                         .with()),
      takeovers_(r.counter("pstrain_ps_takeovers_total",
                           "Times this ps took over the shard of the ps it backs up (its "
                           "primary silent for replication.backup_silence).")
                     .with()),
      rejoins_(r.counter("pstrain_ps_rejoins_total",
                         "Shard states this ps received whole (replication re-join): its "
                         "own shard handed back after a restart, or a new copy of its "
                         "primary's shard.")
                   .with()),
      handbacks_(r.counter("pstrain_ps_handbacks_total",
                           "Times this ps handed the shard it keeps a copy of back to a new "
                           "process of its primary (a restart re-joining).")
                     .with()),
      rejoin_seconds_(r.histogram("pstrain_ps_rejoin_seconds",
                                  "Time from the ping asking for (restart) or carrying (copy to "
                                  "a returning backup) a shard's state until it was installed "
                                  "(replication re-join).",
                                  kRequestSeconds)
                          .with()),
      unserved_(r.counter("pstrain_ps_unserved_requests_total",
                          "Data requests left unanswered because this ps may not serve them "
                          "now (replication: a primary without its backup's lease, or whose "
                          "backup took over; a backup whose primary lives).")
                    .with()),
      updates_lost_(r.counter("pstrain_ps_updates_lost_total",
                              "Acknowledged updates of a worker that a restore of this ps lost.",
                              {"worker"})),
      workers_by_state_(r.gauge("pstrain_ps_workers",
                                "Workers by liveness (server/coordinator.h): pending, live, "
                                "absent, done.",
                                {"state"})),
      heartbeat_age_(r.gauge("pstrain_ps_worker_heartbeat_age_seconds",
                             "Seconds since this ps last heard from the worker; NaN while it "
                             "is pending or done.",
                             {"worker"})),
      start_time_(r.gauge("pstrain_ps_start_time_seconds", "UNIX time this ps started.").with()),
      sparse_ids_(r.histogram("pstrain_ps_sparse_ids_per_request",
                              "Unique ids a sparse pull or push carried.",
                              {1, 10, 100, 1e3, 1e4, 1e5, 1e6})
                      .with()),
      table_rows_(r.gauge("pstrain_ps_table_rows", "Rows this ps holds, by table.", {"table"})),
      table_bytes_(r.gauge("pstrain_ps_table_bytes",
                           "Resident bytes of a table's rows, state, index and clocks on this ps.",
                           {"table"})),
      table_created_(r.counter("pstrain_ps_table_rows_created_total",
                               "Rows created by pushes, by table.", {"table"})),
      table_admission_dropped_(r.counter(
          "pstrain_ps_table_admission_dropped_total",
          "Row gradients dropped because their id was not yet admitted (admit_after).", {"table"})),
      table_evicted_(r.counter("pstrain_ps_table_rows_evicted_total",
                               "Least recently updated rows evicted at max_rows_per_ps.",
                               {"table"})),
      table_expired_(r.counter("pstrain_ps_table_rows_expired_total",
                               "Rows removed after expire_after_s without an update.", {"table"})),
      table_pulled_(
          r.counter("pstrain_ps_table_rows_pulled_total", "Rows answered to pulls.", {"table"})),
      table_pushed_(
          r.counter("pstrain_ps_table_rows_pushed_total", "Row gradients applied.", {"table"})) {
  for (const auto* state : kWorkerStates) workers_by_state_.with({state});
  start_time_.set(unix_time());
}

void PsStats::ssp_staleness(std::uint64_t steps) {
  ssp_staleness_.observe(double(steps));
  ssp_staleness_max_.raise(double(steps));
}

void PsStats::held(std::size_t reads, std::size_t gradients) {
  parked_read_.set(double(reads));
  parked_gradient_.set(double(gradients));
}

void PsStats::refresh(const ChunkStore& store, const TableStore& tables,
                      const Coordinator::Figures& coordinator, Clock::time_point now) {
  tables_ = tables.figures();
  for (const auto& t : tables_) {
    table_rows_.with({t.name}).set(double(t.rows));
    table_bytes_.with({t.name}).set(double(t.bytes));
    catch_up(table_created_.with({t.name}), double(t.created));
    catch_up(table_admission_dropped_.with({t.name}), double(t.admission_dropped));
    catch_up(table_evicted_.with({t.name}), double(t.evicted));
    catch_up(table_expired_.with({t.name}), double(t.expired));
    catch_up(table_pulled_.with({t.name}), double(t.rows_pulled));
    catch_up(table_pushed_.with({t.name}), double(t.rows_pushed));
  }
  const auto& s = store.stats();
  catch_up(updates_, double(s.updates));
  catch_up(copies_on_write_, double(s.copies_on_write));
  catch_up(optimizer_seconds_, s.optimizer_seconds);
  chunks_.set(double(store.size()));
  elements_.set(double(store.elements()));
  version_sum_.set(double(store.version_sum()));
  version_max_.set(double(store.version_max()));
  global_samples_.set(double(coordinator.global_samples));
  parked_barrier_.set(double(coordinator.parked_barrier));
  parked_kv_get_.set(double(coordinator.parked_kv_get));
  for (std::size_t w = 0; w < coordinator.updates_lost.size(); ++w)
    catch_up(updates_lost_.with({std::to_string(w)}), double(coordinator.updates_lost[w]));
  workers_ = coordinator.updates_lost.size();
  for (const auto* state : kWorkerStates)
    workers_by_state_.with({state}).set(double(std::ranges::count_if(
        coordinator.workers, [&](const auto& w) { return std::string_view(w.state) == state; })));
  for (std::size_t w = 0; w < coordinator.workers.size(); ++w) {
    const auto& worker = coordinator.workers[w];
    const bool ageing = worker.heard && (std::string_view(worker.state) == "live" ||
                                         std::string_view(worker.state) == "absent");
    heartbeat_age_.with({std::to_string(w)})
        .set(ageing ? std::chrono::duration<double>(now - *worker.heard).count()
                    : std::numeric_limits<double>::quiet_NaN());
  }
}

std::string PsStats::json(double now_unix) const {
  std::ostringstream j;
  j << "{\"ps\":" << ps_index_ << ",\"requests\":{";
  for (std::uint8_t op = 1; op <= wire::kMaxOp; ++op)
    j << (op > 1 ? "," : "") << '"' << wire::to_string(static_cast<wire::Op>(op))
      << "\":" << whole(requests_[op]->value());
  j << "},\"messages\":" << whole(messages_.value()) << ",\"errors\":" << whole(errors_.value())
    << ",\"malformed\":" << whole(malformed_.value())
    << ",\"resends_answered\":" << whole(resends_answered_.value())
    << ",\"requests_too_old\":" << whole(too_old_.value())
    << ",\"fault_drops\":" << whole(fault_drops_.value())
    << ",\"nonfinite_refused\":" << whole(nonfinite_.value())
    << ",\"refused\":" << whole(refused_.value())
    << ",\"replies_dropped\":" << whole(replies_dropped_.value())
    << ",\"bytes_in\":" << whole(total(bytes_in_)) << ",\"bytes_out\":" << whole(total(bytes_out_))
    << ",\"optimizer_seconds\":" << optimizer_seconds_.value()
    << ",\"updates\":" << whole(updates_.value())
    << ",\"copies_on_write\":" << whole(copies_on_write_.value())
    << ",\"chunks\":" << whole(chunks_.value()) << ",\"elements\":" << whole(elements_.value())
    << ",\"version_sum\":" << whole(version_sum_.value())
    << ",\"version_max\":" << whole(version_max_.value())
    << ",\"global_samples\":" << whole(global_samples_.value())
    << ",\"parked_barrier\":" << whole(parked_barrier_.value())
    << ",\"parked_kv_get\":" << whole(parked_kv_get_.value())
    << ",\"parked_read\":" << whole(parked_read_.value())
    << ",\"parked_gradient\":" << whole(parked_gradient_.value())
    << ",\"ssp_staleness_max\":" << whole(ssp_staleness_max_.value())
    << ",\"gradients_dropped\":" << whole(gradients_dropped_.value())
    << ",\"replica_forwards\":" << whole(replica_forwards_.value())
    << ",\"replication_pending\":" << whole(replication_pending_.value())
    << ",\"backup_losses\":" << whole(backup_losses_.value())
    << ",\"takeovers\":" << whole(takeovers_.value()) << ",\"rejoins\":" << whole(rejoins_.value())
    << ",\"handbacks\":" << whole(handbacks_.value())
    << ",\"unserved\":" << whole(unserved_.value()) << ",\"updates_lost\":[";
  for (std::size_t w = 0; w < workers_; ++w)
    j << (w ? "," : "") << whole(updates_lost_.with({std::to_string(w)}).value());
  j << "],\"tables\":{";
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    const auto& t = tables_[i];
    j << (i ? "," : "") << '"' << t.name << "\":{\"rows\":" << t.rows << ",\"bytes\":" << t.bytes
      << ",\"created\":" << t.created << ",\"admission_dropped\":" << t.admission_dropped
      << ",\"evicted\":" << t.evicted << ",\"expired\":" << t.expired
      << ",\"rows_pulled\":" << t.rows_pulled << ",\"rows_pushed\":" << t.rows_pushed << "}";
  }
  j << "},\"uptime_seconds\":" << now_unix - start_time_.value() << "}";
  return j.str();
}

void PsStats::add_handler(Handlers& handlers, ReplySink& sink, const ChunkStore& store,
                          const TableStore& tables, const Coordinator& coordinator) {
  handlers.on(wire::Op::stats,
              [this, &sink, &store, &tables, &coordinator](const Request& request) {
                refresh(store, tables, coordinator.figures(), request.received);
                Reply reply{wire::reply_to(request.header), {}};
                wire::StatsReply{json(unix_time())}.write(reply.header);
                sink.send(request.from, std::move(reply));
              });
}

}  // namespace pstrain::ps
