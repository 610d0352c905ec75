#pragma once
// The ps's embedding tables (docs/embeddings.md): the rows of each table
// that live on this ps (shared/embedding.h, row_home), keyed by row key,
// kept within memory, and cut for checkpoints without stalling serving.
//
// Layout. A table's rows are spread over kSegments segments by a hash of
// the key. A segment maps keys to slots with an absl::flat_hash_map
// (Abseil, Debian's libabsl-dev): an open-addressing Swiss table that probes
// one-byte tags with SIMD and costs about one byte per slot beyond the
// entry, kept by the team that serves Google's own lookups with it;
// std::unordered_map would add a node allocation and a pointer chase per
// row. A slot's values and optimizer state sit side by side in pages of
// kPageRows rows, with the row's update clock and second beside them, so
// a row costs its floats plus about 40 bytes (docs/embeddings.md).
//
// Creation. A pull of a row that does not exist answers init_row's values
// and stores nothing; a push creates the row with those values and the row
// optimizer's initial state (the same on every ps, after a restart and
// across runs) and applies its gradient. So only trained rows take memory,
// and no init round is needed.
//
// Bounds (TableSpec): with admit_after k, the first k pushes that touch an
// id without a row are dropped (counted) and the next one creates it; the
// sightings are counted in a fixed-size counting filter (two hashed
// 8-bit counters, the lower one read), so unadmitted ids take no memory of
// their own and a collision can only admit an id early. Rows not updated
// for expire_after_s are removed by a sweep that runs a slice at a time
// (tick()), a whole pass every expire_after_s / 8. A push that would take
// the table past max_rows_per_ps first evicts the least recently updated
// rows (by the table's update clock; 1/64 of the cap beyond what is needed,
// so that the scan this takes runs once per cap/64 new rows), never rows of
// the push itself; a push of more rows than the cap is refused.
//
// Cuts. cut() marks every segment pending and returns at once (O(segments)).
// A writer thread then reads the segments one by one, each under its mutex,
// and releases it. Until it has, the ps thread saves the pre-image of a row
// of a pending segment before it changes (updates, creates or removes) it,
// under that segment's mutex; the writer writes pre-images where it finds
// them, so the file holds the rows exactly as they were at the cut, and no
// request waits longer than one segment's copy. A second cut while one is
// being written (a snapshot during a checkpoint) copies the rows at once.
//
// Thread rules: every call but the cut's views runs on the ps thread, like
// the whole ps (server/request.h). A TableCut's row callbacks run on its
// writer's thread; they read only pending segments, under their mutex, and
// the ps thread changes a pending segment only under that mutex. The store
// must outlive its cuts.
#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shared/embedding.h"
#include "shared/row_optimizer.h"
#include "shared/snapshot.h"

namespace pstrain::ps {

// One table's figures on this ps, as metrics and the stats op show them.
struct TableFigures {
  std::string name;
  std::uint64_t rows = 0;               // held now
  std::uint64_t bytes = 0;              // resident: pages, index, clocks
  std::uint64_t created = 0;            // rows created by pushes
  std::uint64_t admission_dropped = 0;  // row gradients of ids not yet admitted
  std::uint64_t evicted = 0;            // rows removed by max_rows_per_ps
  std::uint64_t expired = 0;            // rows removed by expire_after_s
  std::uint64_t rows_pulled = 0;
  std::uint64_t rows_pushed = 0;
};

struct TableStoreOptions {
  std::uint64_t seed = 0;  // the shard map's and init_row's (train.seed)
  std::uint32_t ps_index = 0;
  std::uint32_t servers = 1;
  // checkpoint.incremental: the keys of rows removed since the last
  // checkpoint cut are kept until the next one, so a delta can drop them.
  bool track_removed = false;
};

// How a cut relates to the checkpoints before it.
enum class CutKind {
  snapshot,          // every row; checkpoints' bookkeeping untouched
  checkpoint_whole,  // every row; the next delta starts here
  checkpoint_delta,  // rows updated and keys removed since the last checkpoint cut
};

class TableStore;

// The tables as they were at a cut, for a writer on another thread.
class TableCut {
 public:
  TableCut();
  TableCut(TableCut&&) noexcept;
  TableCut& operator=(TableCut&&) noexcept;
  ~TableCut();  // releases the segments the writer did not read

  // The tables for write_snapshot. Each view's `rows` may run once; they
  // read the store and are valid while this cut lives.
  const std::vector<TableSnapshotView>& views() const;

 private:
  friend class TableStore;
  struct State;
  std::unique_ptr<State> state_;
};

class TableStore {
 public:
  // `tables`: every table of the run; this ps holds the rows
  // row_home(key, servers, seed) puts on `ps_index`.
  TableStore(const std::vector<TableSpec>& tables, const RowOptimizerConfig& optimizer,
             TableStoreOptions options);
  ~TableStore();
  TableStore(const TableStore&) = delete;
  TableStore& operator=(const TableStore&) = delete;

  // The table named `name`; throws std::invalid_argument when there is
  // none.
  const TableSpec& spec(std::string_view name) const;
  // Throws std::invalid_argument naming the table and the first bad key
  // unless `keys` are sorted, unique, rows of the table (below `rows:` for
  // a fixed one) and homed on this ps.
  void check_keys(std::string_view table, std::span<const std::uint64_t> keys) const;
  // Copies the rows of `keys` (checked) into `out`, keys.size() x dim: a
  // row that does not exist reads as its initial values.
  void read(std::string_view table, std::span<const std::uint64_t> keys, std::span<float> out);
  // Applies `grads` (keys.size() x dim, finite) to the rows of `keys`
  // (checked) with the table's row optimizer at UNIX second `now`, creating
  // the admitted rows that do not exist, evicting for them at the cap;
  // returns how many it created. Throws std::invalid_argument, changing
  // nothing, when the keys or sizes are wrong or the push has more rows
  // than max_rows_per_ps.
  std::uint64_t update(std::string_view table, std::span<const std::uint64_t> keys,
                       std::span<const float> grads, std::uint32_t now);
  // Runs a slice of the expiry sweep when one is due at UNIX second `now`.
  void tick(std::uint32_t now);
  // Removes every row not updated for expire_after_s at `now`, at once (a
  // scan of every row: for tests and tools; serving uses tick()).
  void expire(std::uint32_t now);

  // Rows of `table` this ps holds.
  std::size_t rows(std::string_view table) const;
  std::vector<TableFigures> figures() const;

  TableCut cut(CutKind kind);
  // Replaces a table's rows with a whole file's (delta false), or applies a
  // delta: removes its removed keys, then writes its rows. Throws
  // std::invalid_argument naming the table when it does not fit this run
  // (no such table, another width or row optimizer, a row homed elsewhere).
  // For a store that serves nothing yet (a start's restore).
  void restore(const TableSnapshot& table, bool delta);
  // Makes a table's rows those of `table` (a shard's state handed over
  // whole, server/shard_state.h) while the store serves: rows it lacks are
  // removed and the others written row by row, so a checkpoint's cut in
  // flight still writes the rows as they were at the cut, and the next
  // incremental checkpoint carries every row (their clocks do not tell
  // what changed). Throws as restore() does, before anything changes.
  void replace(const TableSnapshot& table);
  // Throws as replace() would, changing nothing.
  void check(const TableSnapshot& table) { fitting(table); }
  // Every table's header as a cut would write it now: what sizes a copy
  // of the rows (with rows()) before anything is copied.
  std::vector<TableHeader> headers() const;

  struct Table;
  struct Segment;

 private:
  Table& table(std::string_view name);
  const Table& table(std::string_view name) const;
  // The table, once `keys` are checked and `floats` (of `what`) is one
  // row's worth per key; else throws std::invalid_argument.
  Table& checked(std::string_view name, std::span<const std::uint64_t> keys, std::size_t floats,
                 const char* what);
  // Evicts at least `count` of the least recently updated rows, none of
  // `keep` (sorted).
  void evict(Table& t, std::uint64_t count, std::span<const std::uint64_t> keep);
  // Sweeps segments [from, to) of `t` for expired rows.
  void expire(Table& t, std::uint32_t now, std::size_t from, std::size_t to);
  // The table `file` is of, once it fits this run (restore()'s checks).
  Table& fitting(const TableSnapshot& file);
  // Writes `rows` into `t`, each row's change safe for a live cut.
  void write_rows(Table& t, const TableRows& rows);

  std::vector<std::unique_ptr<Table>> tables_;  // never moved: cuts point into them
  absl::flat_hash_map<std::string, Table*> by_name_;
  TableStoreOptions options_;
  // Whether a live cut's writer may be reading the segments; set on the ps
  // thread by cut(), cleared by the cut's destructor on the writer's.
  std::atomic<bool> cut_live_{false};
  std::size_t sweep_segment_ = 0;  // where the expiry sweep goes on
  std::uint32_t sweep_due_ = 0;    // UNIX second the next sweep starts
};

}  // namespace pstrain::ps
