// The ps's table store (server/table_store.h): rows created by pushes and
// read as their initial values before, ids checked; admission, expiry and
// the row cap with exact counts; cuts that hold the rows as they were
// whatever changes after them; whole and delta cuts restored bit-exact.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "server/checkpointer.h"
#include "server/shard_file.h"
#include "server/table_store.h"
#include "shared/embedding.h"
#include "tests/support/child_process.h"
#include "tests/support/table_rows.h"

using namespace pstrain;
using ps::CutKind;
using ps::TableStore;
using testing::rows_of;

namespace {

RowOptimizerConfig sgd(float lr = 1) {
  RowOptimizerConfig c;
  c.kind = RowOptimizerKind::sgd;
  c.lr = lr;
  return c;
}

using Keys = std::vector<std::uint64_t>;

// A push of gradient `g` to every element of `keys` (dim 1) at second `now`.
std::uint64_t push(TableStore& store, Keys keys, float g, std::uint32_t now = 100) {
  return store.update("emb", keys, std::vector<float>(keys.size(), g), now);
}

std::vector<float> pull(TableStore& store, Keys keys) {
  std::vector<float> out(keys.size() * store.spec("emb").dim);
  store.read("emb", keys, out);
  return out;
}

float initial(const TableSpec& spec, std::uint64_t key, std::uint64_t seed = 1) {
  float v;
  init_row({&v, 1}, seed, spec, key);
  return v;
}

// A view as a file would hold it, read back.
TableSnapshot as_read(const TableSnapshotView& view) {
  TableSnapshot t;
  static_cast<TableHeader&>(t) = view.header;
  view.rows([&](const TableRows& b) {
    t.rows.keys.insert(t.rows.keys.end(), b.keys.begin(), b.keys.end());
    t.rows.clocks.insert(t.rows.clocks.end(), b.clocks.begin(), b.clocks.end());
    t.rows.seconds.insert(t.rows.seconds.end(), b.seconds.begin(), b.seconds.end());
    t.rows.floats.insert(t.rows.floats.end(), b.floats.begin(), b.floats.end());
  });
  t.removed.assign(view.removed.begin(), view.removed.end());
  return t;
}

}  // namespace

TEST_CASE("table store: a pull reads initial values and stores nothing, a push creates the row") {
  const std::vector<TableSpec> tables = {{"emb", 2, std::nullopt}, {"cat", 2, 100}};
  TableStore store(tables, sgd(), {.seed = 9, .ps_index = 0, .servers = 2});
  std::vector<std::uint64_t> here, there;
  for (std::uint64_t k = 0; here.size() < 3 || there.empty(); ++k)
    (row_home(k, 2, 9) == 0 ? here : there).push_back(k);
  here.resize(3);
  std::vector<float> rows(6);
  store.read("emb", here, rows);
  CHECK(store.rows("emb") == 0);
  std::vector<float> want(6);
  for (int i = 0; i < 3; ++i) init_row({want.data() + 2 * i, 2}, 9, tables[0], here[i]);
  CHECK(rows == want);
  // Only the pushed row moves, and only it is created.
  CHECK(store.update("emb", std::vector<std::uint64_t>{here[1]}, std::vector<float>{1, -2}, 5) ==
        1);
  CHECK(store.rows("emb") == 1);
  store.read("emb", here, rows);
  want[2] -= 1;
  want[3] += 2;
  CHECK(rows == want);

  const auto refused = [&](const std::string& table, std::vector<std::uint64_t> keys,
                           const char* why) {
    CAPTURE(why);
    std::vector<float> g(keys.size() * 2, 1.0f);
    CHECK_THROWS_WITH_AS(store.update(table, keys, g, 5), doctest::Contains(why),
                         std::invalid_argument);
  };
  refused("emb", {here[0], here[0]}, "is repeated");
  refused("emb", {here[1], here[0]}, "out of order");
  refused("emb", {there[0]}, "lives on ps 1");
  std::uint64_t beyond = 100;
  while (row_home(beyond, 2, 9) != 0) ++beyond;
  refused("cat", {beyond}, "is not a row of the table's 100");
  refused("nope", {here[0]}, "no embedding table 'nope'");
  // Refusals changed nothing.
  CHECK(store.rows("emb") == 1);
  store.read("emb", here, rows);
  CHECK(rows == want);
}

TEST_CASE("table store: admit_after drops an id's first pushes, counted, then creates its row") {
  TableSpec spec{"emb", 1, std::nullopt};
  spec.admit_after = 2;
  TableStore store({spec}, sgd(), {.seed = 1});
  CHECK(push(store, {5, 6}, 1) == 0);  // 5 and 6 seen once
  CHECK(push(store, {5}, 1) == 0);     // 5 seen twice
  CHECK(store.rows("emb") == 0);
  CHECK(pull(store, {5, 6}) == std::vector<float>{initial(spec, 5), initial(spec, 6)});
  CHECK(push(store, {5, 6}, 1) == 1);  // 5's third push creates it; 6 seen twice
  CHECK(store.rows("emb") == 1);
  // Only the admitting push's gradient reached the row.
  CHECK(pull(store, {5, 6}) == std::vector<float>{initial(spec, 5) - 1, initial(spec, 6)});
  const auto f = store.figures().at(0);
  CHECK(f.admission_dropped == 4);
  CHECK(f.created == 1);
  CHECK(f.rows_pushed == 1);
}

TEST_CASE("table store: rows not updated for expire_after_s are removed, counted") {
  TableSpec spec{"emb", 1, std::nullopt};
  spec.expire_after_s = 10;
  TableStore store({spec}, sgd(), {.seed = 1});
  push(store, {1, 2, 3}, 1, 100);
  push(store, {2}, 1, 105);
  store.expire(109);
  CHECK(store.rows("emb") == 3);
  store.expire(110);  // 1 and 3 are 10 s old, 2 only 5
  CHECK(store.rows("emb") == 1);
  CHECK(pull(store, {1, 2}) == std::vector<float>{initial(spec, 1), initial(spec, 2) - 1 - 1});
  // The sweep in slices (tick) finds the rest once it is due.
  store.tick(115);
  CHECK(store.rows("emb") == 0);
  CHECK(store.figures().at(0).expired == 3);
}

TEST_CASE("table store: at max_rows_per_ps the least recently updated rows are evicted, counted") {
  TableSpec spec{"emb", 1, std::nullopt};
  spec.max_rows_per_ps = 4;
  TableStore store({spec}, sgd(), {.seed = 1});
  push(store, {1, 2}, 1);
  push(store, {3}, 1);
  push(store, {4}, 1);
  push(store, {1}, 1);  // 1 is now the most recent
  CHECK(push(store, {5, 6}, 1) == 2);
  CHECK(store.rows("emb") == 4);
  // 2 and 3 were the oldest; 1, 4, 5 and 6 remain with their updates.
  CHECK(pull(store, {1, 2, 3, 4, 5, 6}) ==
        std::vector<float>{initial(spec, 1) - 1 - 1, initial(spec, 2), initial(spec, 3),
                           initial(spec, 4) - 1, initial(spec, 5) - 1, initial(spec, 6) - 1});
  // Never a row of the push itself, however old: 4 is the oldest but pushed.
  push(store, {4, 7}, 1);
  CHECK(pull(store, {1, 4}) == std::vector<float>{initial(spec, 1), initial(spec, 4) - 1 - 1});
  CHECK(store.figures().at(0).evicted == 3);
  // A push of more rows than the cap is refused whole.
  CHECK_THROWS_WITH_AS(push(store, {10, 11, 12, 13, 14}, 1),
                       doctest::Contains("cannot fit max_rows_per_ps 4"), std::invalid_argument);
  CHECK(store.rows("emb") == 4);
  CHECK(store.figures().at(0).evicted == 3);
}

TEST_CASE("table store: a cut holds the rows as they were, whatever changes before it is read") {
  TableSpec spec{"emb", 1, std::nullopt};
  spec.max_rows_per_ps = 3;
  RowOptimizerConfig adagrad;  // state beside the values, saved with them
  adagrad.lr = 0.5f;
  TableStore store({spec}, adagrad, {.seed = 1});
  push(store, {1, 2, 3}, 1, 100);
  ps::TableCut cut = store.cut(CutKind::checkpoint_whole);
  const auto& view = cut.views().at(0);
  // Copy of the state at the cut, taken by a second cut (a snapshot while
  // the first is in flight copies at once).
  const auto at_cut = rows_of(store.cut(CutKind::snapshot).views().at(0));
  REQUIRE(at_cut.size() == 3);
  CHECK(view.header.clock == 1);
  // After the cut: an update, a new row evicting the oldest, an expiry.
  push(store, {2}, 4, 101);
  push(store, {2, 4}, 1, 102);  // evicts 1 or 3
  CHECK(store.rows("emb") == 3);
  CHECK(rows_of(view) == at_cut);
  // Once read, the segments are the ps's alone again; a later cut sees
  // today's rows.
  cut = {};
  const auto now = rows_of(store.cut(CutKind::snapshot).views().at(0));
  CHECK(now.size() == 3);
  CHECK(now.contains(4));
  CHECK(now.at(2).clock == 3);
  CHECK(now.at(2).floats != at_cut.at(2).floats);
}

TEST_CASE("table store: a whole cut and the deltas after it restore the table bit-exact") {
  TableSpec spec{"emb", 2, std::nullopt};
  spec.max_rows_per_ps = 6;
  RowOptimizerConfig ftrl;
  ftrl.kind = RowOptimizerKind::ftrl;
  ftrl.l1 = 0.01f;
  const ps::TableStoreOptions options{.seed = 3, .track_removed = true};
  TableStore store({spec}, ftrl, options);
  const auto grads = [](std::size_t n, float g) { return std::vector<float>(2 * n, g); };
  store.update("emb", Keys{1, 2, 3, 4}, grads(4, 0.5f), 10);
  const auto whole = as_read(store.cut(CutKind::checkpoint_whole).views().at(0));
  CHECK(whole.rows.keys.size() == 4);
  CHECK(whole.removed.empty());

  store.update("emb", Keys{2, 5, 6}, grads(3, -0.25f), 11);  // 6 rows: at the cap
  store.update("emb", Keys{7}, grads(1, 1.0f), 12);          // evicts 1
  const auto delta1 = as_read(store.cut(CutKind::checkpoint_delta).views().at(0));
  CHECK(delta1.rows.keys.size() == 4);  // 2, 5, 6, 7
  CHECK(delta1.removed == Keys{1});

  store.update("emb", Keys{3}, grads(1, 2.0f), 13);
  const auto delta2 = as_read(store.cut(CutKind::checkpoint_delta).views().at(0));
  CHECK(delta2.rows.keys == Keys{3});
  CHECK(delta2.removed.empty());
  const auto want = rows_of(store.cut(CutKind::snapshot).views().at(0));

  TableStore restored({spec}, ftrl, options);
  restored.restore(whole, false);
  restored.restore(delta1, true);
  restored.restore(delta2, true);
  CHECK(restored.rows("emb") == 6);
  CHECK(rows_of(restored.cut(CutKind::snapshot).views().at(0)) == want);
  // The restored clock goes on: a delta after it holds only new updates.
  restored.update("emb", Keys{4}, grads(1, 1.0f), 14);
  CHECK(as_read(restored.cut(CutKind::checkpoint_delta).views().at(0)).rows.keys == Keys{4});

  SUBCASE("a file that does not fit is refused, naming the table") {
    TableStore other({{"emb", 3, std::nullopt}}, ftrl, options);
    CHECK_THROWS_WITH_AS(other.restore(whole, false), doctest::Contains("rows of 2"),
                         std::invalid_argument);
    TableStore sgd_store({spec}, sgd(), options);
    CHECK_THROWS_WITH_AS(sgd_store.restore(whole, false), doctest::Contains("row optimizer ftrl"),
                         std::invalid_argument);
    TableStore elsewhere({spec}, ftrl, {.seed = 3, .ps_index = 1, .servers = 2});
    CHECK_THROWS_WITH_AS(elsewhere.restore(whole, false), doctest::Contains("not this ps's"),
                         std::invalid_argument);
  }
}

TEST_CASE("table store: a table replaced while it serves keeps a cut in flight as it was") {
  const TableSpec spec{"emb", 1, std::nullopt};
  RowOptimizerConfig adagrad;
  adagrad.lr = 0.5f;
  const ps::TableStoreOptions options{.seed = 1, .track_removed = true};
  // What a backup's copy holds: rows 2 and 5, trained.
  TableStore source({spec}, adagrad, options);
  push(source, {2, 5}, 1, 50);
  push(source, {5}, 3, 51);
  const auto state = as_read(source.cut(CutKind::snapshot).views().at(0));

  TableStore store({spec}, adagrad, options);
  push(store, {1, 2, 3}, 1, 100);
  ps::TableCut cut = store.cut(CutKind::checkpoint_whole);
  const auto at_cut = rows_of(store.cut(CutKind::snapshot).views().at(0));
  store.replace(state);
  // The cut in flight writes the rows as they were before the replace.
  CHECK(rows_of(cut.views().at(0)) == at_cut);
  cut = {};
  // Now the table is the state's: rows 1 and 3 removed, 2 and 5 as sent.
  CHECK(store.rows("emb") == 2);
  CHECK(rows_of(store.cut(CutKind::snapshot).views().at(0)) ==
        rows_of(source.cut(CutKind::snapshot).views().at(0)));
  CHECK(store.cut(CutKind::snapshot).views().at(0).header.clock == 2);
  // The next delta carries every row and drops the removed ones, so a
  // checkpoint chain restored from it holds the replaced table.
  auto delta = as_read(store.cut(CutKind::checkpoint_delta).views().at(0));
  std::ranges::sort(delta.rows.keys);
  std::ranges::sort(delta.removed);
  CHECK(delta.rows.keys == Keys{2, 5});
  CHECK(delta.removed == Keys{1, 3});
  // A state that does not fit changes nothing.
  auto ragged = state;
  ragged.rows.clocks.pop_back();
  CHECK_THROWS_WITH_AS(store.replace(ragged), doctest::Contains("ragged"), std::invalid_argument);
  CHECK(store.rows("emb") == 2);
}

TEST_CASE("checkpointer: incremental writes a whole file every full_every, pruning keeps chains") {
  TempDir dir;
  const TableSpec spec{"emb", 1, std::nullopt};
  TableStore store({spec}, sgd(), {.seed = 1, .track_removed = true});
  ChunkStore chunks(OptimizerConfig{.kind = OptimizerKind::sgd});
  std::vector<std::uint64_t> previous;
  ps::Checkpointer checkpointer(
      {.checkpoints = dir.path(),
       .every = std::chrono::hours(1),
       .keep = 2,
       .incremental = true,
       .full_every = 3},
      [&](CutKind kind, std::uint64_t after) {
        previous.push_back(after);
        ps::ShardCut cut;
        cut.info.kind = SnapshotKind::checkpoint;
        cut.info.optimizer = "sgd";
        cut.info.previous = after;
        cut.tables = store.cut(kind);
        return cut;
      },
      ps::Clock::now());
  // finish() writes one checkpoint and waits for it: seven, a new row each.
  for (std::uint64_t k = 1; k <= 7; ++k) {
    push(store, {k}, 1);
    checkpointer.finish();
  }
  // Whole, delta, delta, whole, ...: each delta continues the one before.
  CHECK(previous == std::vector<std::uint64_t>{0, 1, 2, 0, 4, 5, 0});
  // keep 2 keeps 6 and 7, and 4 and 5, which 6 continues.
  std::vector<std::string> left;
  for (const auto seq : ps::generations(dir.path()))
    for (const auto& entry :
         std::filesystem::directory_iterator(ps::generation_dir(dir.path(), seq)))
      left.push_back(std::to_string(seq) + "/" + entry.path().filename().string());
  std::ranges::sort(left);
  CHECK(left ==
        std::vector<std::string>{"4/ps0.bin", "5/ps0.delta.bin", "6/ps0.delta.bin", "7/ps0.bin"});
  // Generation 6 restores through 4 and 5: rows 1 to 6.
  TableStore restored({spec}, sgd(), {.seed = 1});
  ChunkStore restored_chunks(OptimizerConfig{.kind = OptimizerKind::sgd});
  ps::restore_shard(restored_chunks, restored, ps::generation_dir(dir.path(), 6), 0, 1, 0);
  CHECK(restored.rows("emb") == 6);
  CHECK(pull(restored, {1, 6, 7}) ==
        std::vector<float>{initial(spec, 1) - 1, initial(spec, 6) - 1, initial(spec, 7)});
}
