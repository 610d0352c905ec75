#include "server/ps_role.h"

#include <random>
#include <thread>

#include "server/checkpointer.h"
#include "server/chunk_handlers.h"
#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/ps_stats.h"
#include "server/replicator.h"
#include "server/request_loop.h"
#include "server/shard_file.h"
#include "server/sparse_handlers.h"
#include "server/table_store.h"
#include "shared/curve_keys.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/metrics_server.h"
#include "shared/modes.h"

namespace pstrain {
namespace {

// A new generation for every process start (wire::Header::generation), so
// clients see a restart; never 0, which requests carry.
std::uint64_t new_generation() {
  std::random_device random;
  const std::uint64_t g = std::uint64_t{random()} << 32 | random();
  return g == 0 ? 1 : g;
}

// Under security.curve: ps `index`'s key pair and the public list, which
// must name this very key as ps `index` (else the workers could not reach it).
std::optional<ps::CurveServerOptions> curve_options(const ClusterConfig& config,
                                                    std::uint32_t index) {
  if (!config.security.curve) return std::nullopt;
  const auto dir = keys_dir(config);
  ps::CurveServerOptions curve{
      .own = read_key_pair(dir, {Identity::Role::ps, index}),
      .allowed = read_public_keys(dir),
      .rights = {.workers = static_cast<std::uint32_t>(config.workers.size()),
                 .sync = traits(config.mode).allreduce(),
                 .replica_of = std::nullopt}};
  if (public_key_of(curve.allowed, {Identity::Role::ps, index}, dir) != curve.own.public_key)
    throw CurveKeyError((dir / kPublicKeysFile).string() +
                        ": the key listed for ps:" + std::to_string(index) + " is not the one of " +
                        (dir / Identity{Identity::Role::ps, index}.file_stem()).string() +
                        ".key (keys of two different keygen runs?)");
  return curve;
}

// A shard as re-join reads and replaces it (server/dispatcher.h): its
// chunks, rows and the mode's worker clocks; `coordinator` (none for a
// copy) starts its per-worker counts afresh from a replaced shard's.
ps::ShardAccess shard_access(ChunkStore& store, ps::TableStore& tables, ps::ChunkHandlers& data,
                             ps::Coordinator* coordinator) {
  return {.chunks = [&store] { return store.refs(); },
          .tables = &tables,
          .clocks = [&data] { return data.worker_clocks(); },
          .replace =
              [&store, &tables, &data, coordinator](ps::ShardState state) {
                // Every table fits before anything changes.
                for (const auto& table : state.tables) tables.check(table);
                const auto updates = state.updates();
                store.restore(std::move(state.chunks));
                for (const auto& table : state.tables) tables.replace(table);
                data.adopt_worker_clocks(state.clocks);
                if (coordinator) coordinator->adopt_shard(updates);
              }};
}

// How often the registry takes the store's and coordinator's figures while
// the endpoint serves; Prometheus scrapes every few seconds at most.
constexpr auto kMetricsRefresh = std::chrono::milliseconds(100);

}  // namespace

int run_ps_role(const ClusterConfig& config, std::uint32_t index,
                const std::optional<std::filesystem::path>& restore) {
  if (index >= config.ps.size()) {
    log("no ps ", index, " in the cluster (it has ", config.ps.size(), ")");
    return 2;
  }
  // First: a metrics port already taken stops the ps before it restores.
  ProcessMetrics metrics(config, Role::ps, index);
  const auto address = config.ps[index].bind_address();
  const auto hash = config.hash();
  ChunkStore store(config.optimizer,
                   ps_apply_threads(config, index, std::thread::hardware_concurrency()));
  ps::TableStore tables(
      config.tables, config.optimizer.sparse,
      {.seed = config.train.seed,
       .ps_index = index,
       .servers = static_cast<std::uint32_t>(config.ps.size()),
       .track_removed = config.checkpoint.every_s > 0 && config.checkpoint.incremental});
  std::optional<ps::RestoredShard> restored;
  try {
    if (restore == "latest")
      restored =
          ps::restore_latest(store, tables, ps::checkpoints_dir(config.run_dir), index, hash);
    else if (restore)
      restored = ps::restore_shard(store, tables, *restore, index, config.ps.size(), hash);
  } catch (const SnapshotError& e) {
    log("cannot restore: ", e.what());
    return 2;
  }
  std::optional<ps::CurveServerOptions> curve;
  try {
    curve = curve_options(config, index);
  } catch (const CurveKeyError& e) {
    log("cannot start with security.curve: ", e.what());
    return 2;
  }
  // Logged, so that a restart's log says which checkpoint it continues.
  const std::uint64_t restored_from = restored ? restored->checkpoint_seq : 0;
  ps::PsStats stats(metrics.registry(), index);
  const auto generation = new_generation();
  // replication.replicas 2: this ps forwards its shard's updates to the next
  // ps of the ring and keeps the copy of the one before's (server/replicator.h).
  const auto servers = static_cast<std::uint32_t>(config.ps.size());
  const bool replicated = config.replication.replicas > 1;
  const std::uint32_t backup = (index + 1) % servers;
  const std::uint32_t replica_of = (index + servers - 1) % servers;
  std::optional<ps::ReplicatorOptions> replication;
  if (replicated) {
    replication = ps::ReplicatorOptions{
        .ps_index = index,
        .run_id = config.run_id(),
        .backup_index = backup,
        .backup_address = config.ps[backup].connect_address(),
        .curve = std::nullopt,
        .retry_interval = std::chrono::duration_cast<ps::Clock::duration>(
            std::chrono::duration<double>(config.net.retry_interval)),
        .backup_silence = std::chrono::duration_cast<ps::Clock::duration>(
            std::chrono::duration<double>(config.replication.backup_silence))};
    if (curve) {
      curve->rights.replica_of = replica_of;
      replication->curve.emplace(
          curve->own,
          public_key_of(curve->allowed, {Identity::Role::ps, backup}, keys_dir(config)));
    }
  }
  ps::RequestLoop loop({.ps_index = index,
                        .run_id = config.run_id(),
                        .config_hash = hash,
                        .config_yaml = config.to_yaml(),
                        .bind_address = address,
                        .generation = generation,
                        .io_threads = io_threads(config.net.io_threads,
                                                 static_cast<std::uint32_t>(config.workers.size()),
                                                 std::thread::hardware_concurrency()),
                        .fault = config.net.fault,
                        .fault_seed = config.train.seed ^ (0x9e3779b97f4a7c15ULL * (index + 1)),
                        .curve = std::move(curve),
                        .replication = std::move(replication),
                        .replica_of = replicated ? std::optional(replica_of) : std::nullopt},
                       stats);
  ps::Coordinator coordinator(
      {"ps " + std::to_string(index), static_cast<std::uint32_t>(config.workers.size()),
       std::chrono::duration<double>(config.net.worker_timeout), config.train.on_worker_loss,
       std::chrono::duration<double>(takeover_silence(config.net))},
      loop);
  if (restored) coordinator.restore_progress(restored->info, store.version_sum());
  const ps::Shard shard{store, tables, coordinator, hash};
  // The mode's rules, the same for the shard and the copy: the copy applies
  // the forwarded updates with the same arithmetic, and serves as the shard
  // does once taken over.
  const ps::Consistency consistency{.mode = config.mode,
                                    .workers = static_cast<std::uint32_t>(config.workers.size()),
                                    .staleness_bound = config.train.staleness_bound,
                                    .backup_workers = config.train.backup_workers,
                                    .lr_scaling = config.train.lr_scaling,
                                    .accumulate_steps = config.train.accumulate_steps};
  ps::ChunkHandlers data(
      store, coordinator, loop, stats, ps::shard_file(config.run_dir / "snapshot", index),
      [&shard] { return ps::cut_shard(shard, ps::CutKind::snapshot); }, consistency);
  // The copy of ps replica_of's shard: a store of its own, so that this
  // ps's snapshots, checkpoints and figures stay its own shard's; its updates
  // are counted by a coordinator of their own likewise.
  std::optional<ChunkStore> replica_store;
  std::optional<ps::TableStore> replica_tables;
  std::optional<ps::Coordinator> replica_coordinator;
  std::optional<ps::Shard> replica_shard;
  std::optional<ps::ChunkHandlers> replica_data;
  std::optional<ps::SparseHandlers> replica_sparse;
  if (replicated) {
    replica_store.emplace(config.optimizer, store.apply_threads());
    // The rows ps replica_of holds (check_keys accepts those only).
    replica_tables.emplace(config.tables, config.optimizer.sparse,
                           ps::TableStoreOptions{.seed = config.train.seed,
                                                 .ps_index = replica_of,
                                                 .servers = servers,
                                                 .track_removed = false});
    replica_coordinator.emplace(
        ps::CoordinatorOptions{
            "ps " + std::to_string(index) + " (copy of ps " + std::to_string(replica_of) + ")",
            static_cast<std::uint32_t>(config.workers.size()),
            std::chrono::duration<double>(config.net.worker_timeout), config.train.on_worker_loss,
            std::chrono::duration<double>(takeover_silence(config.net))},
        loop);
    replica_shard.emplace(ps::Shard{*replica_store, *replica_tables, *replica_coordinator, hash});
    auto copy_consistency = consistency;
    copy_consistency.liveness = &coordinator;  // it hears the workers
    copy_consistency.follows = [&loop] { return !loop.serves_copy(); };
    replica_data.emplace(
        *replica_store, *replica_coordinator, loop, stats,
        // Written only once this ps took the shard over (server/dispatcher.h):
        // then as that ps's own end-of-run snapshot.
        ps::shard_file(config.run_dir / "snapshot", replica_of),
        [&replica_shard] { return ps::cut_shard(*replica_shard, ps::CutKind::snapshot); },
        copy_consistency);
    replica_data->add_copy_handlers(loop.replica_handlers());
    replica_sparse.emplace(*replica_tables, *replica_coordinator, loop, stats);
    replica_sparse->add_handlers(loop.replica_handlers());
    // Re-join: a restarted ps gets its shard from its backup's copy, and a
    // backup given up gets a new copy (server/replicator.h, "Re-join").
    loop.set_shards(shard_access(store, tables, data, &coordinator),
                    shard_access(*replica_store, *replica_tables, *replica_data, nullptr));
  }
  ps::SparseHandlers sparse(tables, coordinator, loop, stats);
  coordinator.add_handlers(loop.handlers());
  data.add_handlers(loop.handlers());
  sparse.add_handlers(loop.handlers());
  stats.add_handler(loop.handlers(), loop, store, tables, coordinator);
  try {
    loop.bind();
  } catch (const ps::NetworkError& e) {
    log(e.what());
    return 2;
  }
  log("serving on ", address, " (", config.workers.size(), " workers, optimizer ",
      to_string(config.optimizer.kind), " on ", store.apply_threads(),
      " thread(s) per large chunk, restored_from ", restored_from, ", generation ", generation,
      config.security.curve ? ", CURVE" : "", ")");
  std::optional<ps::Checkpointer> checkpointer;
  if (config.checkpoint.every_s > 0)
    checkpointer.emplace(
        ps::CheckpointerOptions{ps::checkpoints_dir(config.run_dir), index,
                                std::chrono::duration<double>(config.checkpoint.every_s),
                                config.checkpoint.keep, config.checkpoint.incremental,
                                config.checkpoint.full_every,
                                [&stats](double s) { stats.checkpoint_written(s); }},
        [&](ps::CutKind kind, std::uint64_t previous) {
          return ps::cut_shard(shard, kind, previous);
        },
        ps::Clock::now());
  int code = 1;
  // The store's and coordinator's figures reach the registry by refresh()
  // (server/ps_stats.h): often enough for a scrape, not per request.
  ps::Clock::time_point next_refresh{};
  try {
    code = loop.run(coordinator, [&](ps::Clock::time_point now) {
      data.tick();
      if (replica_data) replica_data->tick();
      tables.tick(static_cast<std::uint32_t>(unix_time()));
      if (checkpointer) checkpointer->tick(now);
      if (metrics.serving() && now >= next_refresh) {
        stats.refresh(store, tables, coordinator.figures(), now);
        next_refresh = now + kMetricsRefresh;
      }
    });
  } catch (const ps::NetworkError& e) {
    log(e.what());
  }
  // Whatever ended the serving, what was applied is saved; but not the
  // shard of a ps fenced by its backup, which serves the current one.
  data.finish();
  data.log_summary();
  if (checkpointer && !loop.fenced()) checkpointer->finish();
  stats.refresh(store, tables, coordinator.figures(), ps::Clock::now());
  metrics.finish();
  return code;
}

}  // namespace pstrain
