#include "server/table_store.h"

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "shared/init.h"

namespace pstrain::ps {
namespace {

// Segments per table: a writer holds one segment's mutex while it copies
// that segment, 1/256 of the table; a table of 10^7 rows on one ps has
// about 40k rows per segment, a millisecond's copy.
constexpr std::size_t kSegmentBits = 8;
constexpr std::size_t kSegments = std::size_t{1} << kSegmentBits;
// Rows per page: memory grows a page at a time, so a segment wastes at most
// one page, and a page is never moved once written.
constexpr std::size_t kPageRows = 256;
// The admission filter's counters per table (4 MiB); ids beyond a few
// million distinct unadmitted ones start to share counters.
constexpr std::size_t kAdmitCounters = std::size_t{1} << 22;
// Rows an expiry slice looks at, about a millisecond's work.
constexpr std::size_t kSweepRows = std::size_t{1} << 16;

// Apart from row_home's hash, so a ps's rows spread over all segments.
std::size_t segment_of(std::uint64_t key) {
  return splitmix64(key ^ 0x2545f4914f6cdd1dULL) >> (64 - kSegmentBits);
}

std::string table_named(const std::string& name) { return "table '" + name + "'"; }

}  // namespace

// A row as it was at the cut, saved before the ps thread changed it.
struct PreImage {
  bool existed = false;  // false: the row was created after the cut
  std::uint64_t clock = 0;
  std::uint32_t second = 0;
  std::vector<float> floats;
};

struct TableStore::Segment {
  absl::flat_hash_map<std::uint64_t, std::uint32_t> slots;  // key -> slot
  std::vector<std::unique_ptr<float[]>> pages;              // kPageRows slots each
  std::vector<std::uint64_t> clocks;                        // per slot
  std::vector<std::uint32_t> seconds;                       // per slot
  std::vector<std::uint32_t> free;                          // slots of removed rows
  // Set by a live cut until its writer has read this segment; while set,
  // the ps thread changes the segment only under `mutex`, saving pre-images
  // in `before` (which only then is touched from two threads).
  std::atomic<bool> pending{false};
  std::mutex mutex;
  absl::flat_hash_map<std::uint64_t, PreImage> before;

  float* at(std::uint32_t slot, std::size_t row_floats) const {
    return pages[slot / kPageRows].get() + (slot % kPageRows) * row_floats;
  }
  std::uint32_t allocate(std::size_t row_floats) {
    if (!free.empty()) {
      const auto slot = free.back();
      free.pop_back();
      return slot;
    }
    const auto slot = static_cast<std::uint32_t>(clocks.size());
    if (slot % kPageRows == 0)
      pages.push_back(std::make_unique_for_overwrite<float[]>(kPageRows * row_floats));
    clocks.push_back(0);
    seconds.push_back(0);
    return slot;
  }
  std::uint64_t bytes(std::size_t row_floats) const {
    return pages.size() * kPageRows * row_floats * sizeof(float) +
           slots.capacity() * (sizeof(std::pair<const std::uint64_t, std::uint32_t>) + 1) +
           clocks.capacity() * sizeof(std::uint64_t) + seconds.capacity() * sizeof(std::uint32_t) +
           free.capacity() * sizeof(std::uint32_t);
  }
  // Appends the rows with a clock above `since` to `out`: as they were at
  // the cut when `at_cut` (pre-images where there are some), else as they
  // are.
  void append(std::size_t row_floats, std::uint64_t since, bool at_cut, TableRows& out) const {
    const auto add = [&](std::uint64_t key, std::uint64_t clock, std::uint32_t second,
                         const float* f) {
      if (clock <= since) return;
      out.keys.push_back(key);
      out.clocks.push_back(clock);
      out.seconds.push_back(second);
      out.floats.insert(out.floats.end(), f, f + row_floats);
    };
    for (const auto& [key, slot] : slots)
      if (!at_cut || !before.contains(key))
        add(key, clocks[slot], seconds[slot], at(slot, row_floats));
    if (at_cut)
      for (const auto& [key, pre] : before)
        if (pre.existed) add(key, pre.clock, pre.second, pre.floats.data());
  }
};

// Makes a change to one row safe for a cut in flight: while the row's
// segment is pending, holds the segment's mutex for the change and saves the
// row's pre-image first (once per cut).
class RowChange {
 public:
  RowChange(TableStore::Segment& seg, std::uint64_t key, std::size_t row_floats) {
    if (!seg.pending.load(std::memory_order_acquire)) return;
    lock_ = std::unique_lock(seg.mutex);
    // The writer may have released the segment meanwhile.
    if (!seg.pending.load(std::memory_order_relaxed)) return;
    auto [pre, fresh] = seg.before.try_emplace(key);
    if (!fresh) return;
    if (const auto it = seg.slots.find(key); it != seg.slots.end()) {
      const float* f = seg.at(it->second, row_floats);
      pre->second = {true, seg.clocks[it->second], seg.seconds[it->second], {f, f + row_floats}};
    }
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

struct TableStore::Table {
  Table(const TableSpec& s, const RowOptimizerConfig& o)
      : spec(s),
        optimizer(o, s.dim),
        row_floats(s.dim + optimizer.state_floats()),
        segments(std::make_unique<Segment[]>(kSegments)) {
    if (spec.admit_after > 0) seen.assign(kAdmitCounters, 0);
    figures.name = spec.name;
  }
  Segment& segment(std::uint64_t key) { return segments[segment_of(key)]; }
  const Segment& segment(std::uint64_t key) const { return segments[segment_of(key)]; }

  // Whether a push of `key`, which has no row, creates one now: counts the
  // sighting in the admission filter (conservative update: only the lower
  // counters rise, so a shared counter overstates as little as it can).
  bool admit(std::uint64_t key) {
    if (spec.admit_after == 0) return true;
    const auto h = splitmix64(key ^ 0x5bd1e9955bd1e995ULL);
    auto& a = seen[h & (kAdmitCounters - 1)];
    auto& b = seen[(h >> 32) & (kAdmitCounters - 1)];
    const auto low = std::min(a, b);
    if (low > spec.admit_after) return true;  // admitted before, its row since removed
    const auto next = static_cast<std::uint8_t>(low + 1);
    if (a == low) a = next;
    if (b == low) b = next;
    return next > spec.admit_after;
  }

  // The new row's slot, with init_row's values and the initial state.
  std::uint32_t create(Segment& seg, std::uint64_t key, std::uint64_t seed) {
    const auto slot = seg.allocate(row_floats);
    seg.slots.emplace(key, slot);
    float* row = seg.at(slot, row_floats);
    init_row({row, spec.dim}, seed, spec, key);
    optimizer.init_state({row + spec.dim, optimizer.state_floats()});
    ++rows;
    return slot;
  }

  void remove(std::uint64_t key, bool track_removed) {
    Segment& seg = segment(key);
    RowChange change(seg, key, row_floats);
    const auto it = seg.slots.find(key);
    seg.free.push_back(it->second);
    seg.slots.erase(it);
    --rows;
    if (track_removed) removed.push_back(key);
  }

  TableSpec spec;
  RowOptimizer optimizer;
  std::size_t row_floats;
  std::unique_ptr<Segment[]> segments;  // kSegments; never moved
  std::uint64_t rows = 0;
  std::uint64_t clock = 0;             // pushes applied: a row's clock is the last that touched it
  std::uint64_t cut_clock = 0;         // the clock at the last checkpoint cut
  std::vector<std::uint8_t> seen;      // the admission filter (admit_after > 0)
  std::vector<std::uint64_t> removed;  // since the last checkpoint cut (track_removed)
  TableFigures figures;                // rows and bytes filled in by figures()
};

struct TableCut::State {
  std::atomic<bool>* live = nullptr;  // the store's flag, while this cut reads live segments
  std::vector<TableStore::Table*> tables;
  std::vector<std::uint64_t> since;                 // per table
  std::vector<std::vector<std::uint64_t>> removed;  // per table
  std::vector<TableRows> copies;                    // per table, when not live
  std::vector<TableSnapshotView> views;

  ~State() {
    if (!live) return;
    for (auto* t : tables)
      for (std::size_t s = 0; s < kSegments; ++s) {
        auto& seg = t->segments[s];
        if (!seg.pending.load(std::memory_order_acquire)) continue;
        std::lock_guard lock(seg.mutex);
        seg.before.clear();
        seg.pending.store(false, std::memory_order_release);
      }
    live->store(false, std::memory_order_release);
  }

  // Table i's rows as they were at the cut: a block per segment, each
  // released to the ps thread once read.
  void live_rows(std::size_t i, const std::function<void(const TableRows&)>& emit) const {
    auto* t = tables[i];
    for (std::size_t s = 0; s < kSegments; ++s) {
      auto& seg = t->segments[s];
      TableRows block;
      {
        std::lock_guard lock(seg.mutex);
        seg.append(t->row_floats, since[i], true, block);
        seg.before.clear();
        seg.pending.store(false, std::memory_order_release);
      }
      emit(block);
    }
  }
};

namespace {

TableHeader header_of(const TableStore::Table& t) {
  return {.name = t.spec.name,
          .optimizer = std::string(to_string(t.optimizer.config().kind)),
          .dim = t.spec.dim,
          .state_floats = static_cast<std::uint32_t>(t.optimizer.state_floats()),
          .clock = t.clock};
}

}  // namespace

TableCut::TableCut() = default;
TableCut::TableCut(TableCut&&) noexcept = default;
TableCut& TableCut::operator=(TableCut&&) noexcept = default;
TableCut::~TableCut() = default;

const std::vector<TableSnapshotView>& TableCut::views() const {
  static const std::vector<TableSnapshotView> none;
  return state_ ? state_->views : none;
}

TableStore::TableStore(const std::vector<TableSpec>& tables, const RowOptimizerConfig& optimizer,
                       TableStoreOptions options)
    : options_(options) {
  for (const auto& spec : tables) {
    tables_.push_back(std::make_unique<Table>(spec, optimizer));
    by_name_[spec.name] = tables_.back().get();
  }
}

TableStore::~TableStore() = default;

const TableStore::Table& TableStore::table(std::string_view name) const {
  // Abseil here has its own string_view, which its string hash takes.
  const auto it = by_name_.find(absl::string_view(name.data(), name.size()));
  if (it == by_name_.end())
    throw std::invalid_argument("no embedding table '" + std::string(name) + "'");
  return *it->second;
}

TableStore::Table& TableStore::table(std::string_view name) {
  return const_cast<Table&>(std::as_const(*this).table(name));
}

const TableSpec& TableStore::spec(std::string_view name) const { return table(name).spec; }

std::size_t TableStore::rows(std::string_view name) const { return table(name).rows; }

void TableStore::check_keys(std::string_view name, std::span<const std::uint64_t> keys) const {
  const TableSpec& spec = table(name).spec;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto bad = [&](const std::string& why) {
      throw std::invalid_argument(table_named(spec.name) + ": id " + std::to_string(keys[i]) +
                                  " (position " + std::to_string(i) + ") " + why);
    };
    if (i > 0 && keys[i] == keys[i - 1]) bad("is repeated");
    if (i > 0 && keys[i] < keys[i - 1]) bad("is out of order (ids must be sorted)");
    if (spec.rows && keys[i] >= *spec.rows)
      bad("is not a row of the table's " + std::to_string(*spec.rows));
    if (const auto home = row_home(keys[i], options_.servers, options_.seed);
        home != options_.ps_index)
      bad("lives on ps " + std::to_string(home) + ", not this ps " +
          std::to_string(options_.ps_index));
  }
}

TableStore::Table& TableStore::checked(std::string_view name, std::span<const std::uint64_t> keys,
                                       std::size_t floats, const char* what) {
  Table& t = table(name);
  check_keys(name, keys);
  if (floats != keys.size() * t.spec.dim)
    throw std::invalid_argument(table_named(t.spec.name) + ": " + std::to_string(floats) + " " +
                                what + " for " + std::to_string(keys.size()) + " rows of " +
                                std::to_string(t.spec.dim));
  return t;
}

void TableStore::read(std::string_view name, std::span<const std::uint64_t> keys,
                      std::span<float> out) {
  Table& t = checked(name, keys, out.size(), "values");
  const std::size_t dim = t.spec.dim;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Segment& seg = t.segment(keys[i]);
    if (const auto it = seg.slots.find(keys[i]); it != seg.slots.end())
      std::copy_n(seg.at(it->second, t.row_floats), dim, out.data() + i * dim);
    else
      init_row(out.subspan(i * dim, dim), options_.seed, t.spec, keys[i]);
  }
  t.figures.rows_pulled += keys.size();
}

std::uint64_t TableStore::update(std::string_view name, std::span<const std::uint64_t> keys,
                                 std::span<const float> grads, std::uint32_t now) {
  Table& t = checked(name, keys, grads.size(), "gradients");
  const std::uint64_t cap = t.spec.max_rows_per_ps;
  if (keys.size() > cap)
    throw std::invalid_argument(table_named(t.spec.name) + ": a push of " +
                                std::to_string(keys.size()) + " rows cannot fit max_rows_per_ps " +
                                std::to_string(cap));
  // Where each row is, and which rows the push creates, decided (and the
  // admission filter counted) before any row changes, so the eviction below
  // spares them all. Slots never move, so these stay valid through it.
  constexpr std::uint32_t kNoRow = UINT32_MAX, kCreate = UINT32_MAX - 1;
  struct Place {
    Segment* seg;
    std::uint32_t slot;
  };
  std::vector<Place> places(keys.size());
  std::uint64_t fresh = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    Segment& seg = t.segment(keys[i]);
    const auto it = seg.slots.find(keys[i]);
    places[i] = {&seg, it != seg.slots.end() ? it->second : t.admit(keys[i]) ? kCreate : kNoRow};
    fresh += places[i].slot == kCreate;
  }
  if (t.rows + fresh > cap) evict(t, t.rows + fresh - cap + cap / 64, keys);
  ++t.clock;
  const std::size_t dim = t.spec.dim;
  const std::size_t state = t.optimizer.state_floats();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto [seg, slot] = places[i];
    if (slot == kNoRow) {
      ++t.figures.admission_dropped;
      continue;
    }
    RowChange change(*seg, keys[i], t.row_floats);
    if (slot == kCreate) slot = t.create(*seg, keys[i], options_.seed);
    float* row = seg->at(slot, t.row_floats);
    t.optimizer.update({row, dim}, {row + dim, state}, grads.subspan(i * dim, dim));
    seg->clocks[slot] = t.clock;
    seg->seconds[slot] = now;
    ++t.figures.rows_pushed;
  }
  t.figures.created += fresh;
  return fresh;
}

void TableStore::evict(Table& t, std::uint64_t count, std::span<const std::uint64_t> keep) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> oldest;  // (clock, key)
  oldest.reserve(t.rows);
  for (std::size_t s = 0; s < kSegments; ++s) {
    const Segment& seg = t.segments[s];
    for (const auto& [key, slot] : seg.slots)
      if (!std::ranges::binary_search(keep, key)) oldest.emplace_back(seg.clocks[slot], key);
  }
  count = std::min<std::uint64_t>(count, oldest.size());
  const auto end = oldest.begin() + static_cast<std::ptrdiff_t>(count);
  std::nth_element(oldest.begin(), end, oldest.end());
  for (auto it = oldest.begin(); it != end; ++it) t.remove(it->second, options_.track_removed);
  t.figures.evicted += count;
}

void TableStore::expire(Table& t, std::uint32_t now, std::size_t from, std::size_t to) {
  if (t.spec.expire_after_s <= 0) return;
  std::vector<std::uint64_t> old;
  for (std::size_t s = from; s < to; ++s) {
    const Segment& seg = t.segments[s];
    old.clear();
    for (const auto& [key, slot] : seg.slots)
      if (now >= seg.seconds[slot] && now - seg.seconds[slot] >= t.spec.expire_after_s)
        old.push_back(key);
    for (const auto key : old) t.remove(key, options_.track_removed);
    t.figures.expired += old.size();
  }
}

void TableStore::expire(std::uint32_t now) {
  for (auto& t : tables_) expire(*t, now, 0, kSegments);
}

void TableStore::tick(std::uint32_t now) {
  double shortest = 0;
  for (const auto& t : tables_)
    if (t->spec.expire_after_s > 0 && (shortest == 0 || t->spec.expire_after_s < shortest))
      shortest = t->spec.expire_after_s;
  if (shortest == 0 || (sweep_segment_ == 0 && now < sweep_due_)) return;
  // A slice of about kSweepRows rows, so that no request waits long.
  std::size_t looked = 0;
  while (sweep_segment_ < kSegments && looked < kSweepRows) {
    for (auto& t : tables_) {
      expire(*t, now, sweep_segment_, sweep_segment_ + 1);
      looked += t->segments[sweep_segment_].slots.size();
    }
    ++sweep_segment_;
  }
  if (sweep_segment_ == kSegments) {
    sweep_segment_ = 0;
    // An eighth of the shortest expiry: a row outlives it by at most that.
    sweep_due_ = now + std::max<std::uint32_t>(1, static_cast<std::uint32_t>(shortest / 8));
  }
}

std::vector<TableFigures> TableStore::figures() const {
  std::vector<TableFigures> out;
  for (const auto& t : tables_) {
    TableFigures f = t->figures;
    f.rows = t->rows;
    for (std::size_t s = 0; s < kSegments; ++s) f.bytes += t->segments[s].bytes(t->row_floats);
    out.push_back(std::move(f));
  }
  return out;
}

TableCut TableStore::cut(CutKind kind) {
  TableCut cut;
  cut.state_ = std::make_unique<TableCut::State>();
  auto& st = *cut.state_;
  // One live cut at a time: a second one (a snapshot while a checkpoint is
  // written) copies its rows now instead.
  const bool live = !cut_live_.exchange(true, std::memory_order_acq_rel);
  if (live) st.live = &cut_live_;
  for (auto& t : tables_) {
    std::uint64_t since = 0;
    std::vector<std::uint64_t> removed;
    if (kind == CutKind::checkpoint_delta) {
      since = t->cut_clock;
      removed = std::move(t->removed);
    }
    if (kind != CutKind::snapshot) {
      t->cut_clock = t->clock;
      t->removed.clear();
    }
    st.tables.push_back(t.get());
    st.since.push_back(since);
    st.removed.push_back(std::move(removed));
    if (live) {
      for (std::size_t s = 0; s < kSegments; ++s)
        t->segments[s].pending.store(true, std::memory_order_release);
    } else {
      TableRows rows;
      for (std::size_t s = 0; s < kSegments; ++s)
        t->segments[s].append(t->row_floats, since, false, rows);
      st.copies.push_back(std::move(rows));
    }
  }
  for (std::size_t i = 0; i < st.tables.size(); ++i) {
    const Table& t = *st.tables[i];
    TableSnapshotView view{.header = header_of(t), .rows = {}, .removed = st.removed[i]};
    auto* state = &st;
    if (live)
      view.rows = [state, i](const std::function<void(const TableRows&)>& emit) {
        state->live_rows(i, emit);
      };
    else
      view.rows = [state, i](const std::function<void(const TableRows&)>& emit) {
        emit(state->copies[i]);
      };
    st.views.push_back(std::move(view));
  }
  return cut;
}

TableStore::Table& TableStore::fitting(const TableSnapshot& file) {
  const auto found = by_name_.find(file.name);
  if (found == by_name_.end())
    throw std::invalid_argument("it holds embedding table '" + file.name +
                                "', which this run does not have");
  Table& t = *found->second;
  const std::string ours(to_string(t.optimizer.config().kind));
  if (file.dim != t.spec.dim || file.optimizer != ours ||
      file.state_floats != t.optimizer.state_floats())
    throw std::invalid_argument(table_named(t.spec.name) + " was written with rows of " +
                                std::to_string(file.dim) + " and row optimizer " + file.optimizer +
                                ", this run has rows of " + std::to_string(t.spec.dim) + " and " +
                                ours);
  const auto n = file.rows.keys.size();
  if (file.rows.clocks.size() != n || file.rows.seconds.size() != n ||
      file.rows.floats.size() != n * t.row_floats)
    throw std::invalid_argument(table_named(t.spec.name) + ": the file's rows are ragged");
  for (const auto key : file.rows.keys)
    if (row_home(key, options_.servers, options_.seed) != options_.ps_index ||
        (t.spec.rows && key >= *t.spec.rows))
      throw std::invalid_argument(table_named(t.spec.name) + ": the file holds row " +
                                  std::to_string(key) + ", which is not this ps's");
  return t;
}

void TableStore::write_rows(Table& t, const TableRows& rows) {
  for (std::size_t i = 0; i < rows.keys.size(); ++i) {
    const auto key = rows.keys[i];
    Segment& seg = t.segment(key);
    RowChange change(seg, key, t.row_floats);
    auto it = seg.slots.find(key);
    if (it == seg.slots.end()) {
      it = seg.slots.emplace(key, seg.allocate(t.row_floats)).first;
      ++t.rows;
    }
    std::copy_n(rows.floats.data() + i * t.row_floats, t.row_floats,
                seg.at(it->second, t.row_floats));
    seg.clocks[it->second] = rows.clocks[i];
    seg.seconds[it->second] = rows.seconds[i];
  }
}

void TableStore::restore(const TableSnapshot& file, bool delta) {
  Table& t = fitting(file);
  if (!delta) {
    t.segments = std::make_unique<Segment[]>(kSegments);
    t.rows = 0;
    t.clock = 0;
  }
  for (const auto key : file.removed)
    if (t.segment(key).slots.contains(key)) t.remove(key, false);
  write_rows(t, file.rows);
  t.clock = std::max(t.clock, file.clock);
  t.cut_clock = t.clock;
}

void TableStore::replace(const TableSnapshot& file) {
  Table& t = fitting(file);
  const absl::flat_hash_set<std::uint64_t> kept(file.rows.keys.begin(), file.rows.keys.end());
  std::vector<std::uint64_t> gone;
  for (std::size_t s = 0; s < kSegments; ++s)
    for (const auto& [key, slot] : t.segments[s].slots)
      if (!kept.contains(key)) gone.push_back(key);
  for (const auto key : gone) t.remove(key, options_.track_removed);
  write_rows(t, file.rows);
  // The state's clocks continue the sender's, which applied the same
  // updates in the same order (chain replication).
  t.clock = file.clock;
  t.cut_clock = 0;
}

std::vector<TableHeader> TableStore::headers() const {
  std::vector<TableHeader> out;
  for (const auto& t : tables_) out.push_back(header_of(*t));
  return out;
}

}  // namespace pstrain::ps
