// The ps's chunk store (init semantics, copy-on-write), the snapshot file
// format (round trip, and named errors for every kind of damage), and the
// atomic replacement snapshots are written with.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>

#include "server/chunk_store.h"
#include "shared/atomic_file.h"
#include "shared/snapshot.h"
#include "tests/support/child_process.h"

using namespace pstrain;

namespace {

OptimizerConfig sgd(float lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::sgd;
  c.lr = lr;
  return c;
}

Snapshot sample_snapshot() {
  Snapshot s;
  s.kind = SnapshotKind::checkpoint;
  s.config_hash = 0x0123456789abcdefull;
  s.optimizer = "momentum";
  s.global_samples = 123456789;
  s.worker_samples = {5, 70000000000ull};
  s.worker_incarnations = {0xfeedull, 0xbeefull};
  s.worker_updates = {3, 90000000000ull};
  s.records.push_back(
      {"dense0/w", 3, 17, {1.5f, -2.25f, 3.0f}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}});
  s.records.push_back({"b", 0, 0, {42.0f}, {}});
  return s;
}

std::vector<char> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The names in `dir`: shows whether a writer left a temporary file behind.
std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    names.insert(entry.path().filename().string());
  return names;
}

std::string read_text(const std::filesystem::path& p) {
  const auto bytes = read_bytes(p);
  return {bytes.begin(), bytes.end()};
}

void write_bytes(const std::filesystem::path& p, const std::vector<char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace

TEST_CASE("chunk store: init creates once, same size is a no-op, another size an error") {
  ChunkStore store(sgd(1.0f));
  const std::vector<float> a{1, 2, 3}, b{9, 9, 9}, c{1, 2};
  CHECK(store.init("w", 0, a));
  CHECK_FALSE(store.init("w", 0, b));
  CHECK(*store.find("w", 0)->values == a);
  CHECK_THROWS_WITH_AS(store.init("w", 0, c), doctest::Contains("3"), std::invalid_argument);
  CHECK(store.find("w", 1) == nullptr);
  CHECK_THROWS_WITH_AS(store.push("w", 1, a), doctest::Contains("unknown chunk"),
                       std::invalid_argument);
  CHECK_THROWS_AS(store.push("w", 0, c), std::invalid_argument);
  CHECK(store.find("w", 0)->version == 0);
}

TEST_CASE("chunk store: updates copy a buffer a reader holds, otherwise work in place") {
  ChunkStore store(sgd(1.0f));
  const std::vector<float> grad{1, 1, 1};
  store.init("w", 0, std::vector<float>{5, 6, 7});
  const float* before = store.find("w", 0)->values->data();
  store.push("w", 0, grad);
  CHECK(store.find("w", 0)->values->data() == before);
  CHECK(store.stats().copies_on_write == 0);

  const ValueBuffer held = store.find("w", 0)->values;  // a pull in flight
  const auto& c = store.push("w", 0, grad);
  CHECK(*held == std::vector<float>{4, 5, 6});  // the reader's values are untouched
  CHECK(*c.values == std::vector<float>{3, 4, 5});
  CHECK(c.version == 2);
  CHECK(store.stats().copies_on_write == 1);
  // The new buffer is the store's alone again: the next update is in place.
  const float* fresh = c.values->data();
  store.assign("w", 0, std::vector<float>{0, 0, 0});
  CHECK(store.find("w", 0)->values->data() == fresh);
  CHECK(*held == std::vector<float>{4, 5, 6});
  CHECK(store.stats().copies_on_write == 1);
}

TEST_CASE("chunk store: its chunks round-trip through a snapshot and restore, and state must fit") {
  OptimizerConfig adam;
  adam.kind = OptimizerKind::adam;
  ChunkStore store(adam);
  store.init("w", 0, std::vector<float>{1, 2});
  store.push("w", 0, std::vector<float>{0.5f, -0.5f});
  TempDir dir;
  write_snapshot(dir.path() / "ps0.bin", {}, record_views(store.refs()));
  ChunkStore copy(adam);
  copy.restore(read_snapshot(dir.path() / "ps0.bin").records);
  const auto* c = copy.find("w", 0);
  REQUIRE(c);
  CHECK(*c->values == *store.find("w", 0)->values);
  CHECK(*c->state == *store.find("w", 0)->state);
  CHECK(c->version == 1);
  ChunkStore plain(sgd(0.1f));
  CHECK_THROWS_WITH_AS(plain.restore(read_snapshot(dir.path() / "ps0.bin").records),
                       doctest::Contains("state"), std::invalid_argument);
}

TEST_CASE("chunk store: an update never writes state or values a checkpoint holds") {
  OptimizerConfig momentum;
  momentum.kind = OptimizerKind::momentum;
  ChunkStore store(momentum);
  store.init("w", 0, std::vector<float>{1, 2});
  store.push("w", 0, std::vector<float>{1, 1});
  const auto held = store.refs();  // what a checkpoint being written holds
  const auto values = *held[0].values;
  const auto state = *held[0].state;
  store.push("w", 0, std::vector<float>{1, 1});
  CHECK(*held[0].values == values);
  CHECK(*held[0].state == state);
  CHECK(held[0].version == 1);
  CHECK(*store.find("w", 0)->state != state);
  CHECK(store.stats().copies_on_write == 2);  // values and state, once each
}

TEST_CASE("snapshot: a written file reads back identically") {
  TempDir dir;
  const auto path = dir.path() / "snap" / "ps0.bin";
  const auto s = sample_snapshot();
  write_snapshot(path, s);
  CHECK(names_in(path.parent_path()) == std::set<std::string>{"ps0.bin"});
  const auto r = read_snapshot(path);
  CHECK(r.kind == s.kind);
  CHECK(r.config_hash == s.config_hash);
  CHECK(r.optimizer == s.optimizer);
  CHECK(r.global_samples == s.global_samples);
  CHECK(r.worker_samples == s.worker_samples);
  CHECK(r.worker_incarnations == s.worker_incarnations);
  CHECK(r.worker_updates == s.worker_updates);
  REQUIRE(r.records.size() == s.records.size());
  for (std::size_t i = 0; i < s.records.size(); ++i) {
    CHECK(r.records[i].name == s.records[i].name);
    CHECK(r.records[i].chunk == s.records[i].chunk);
    CHECK(r.records[i].version == s.records[i].version);
    CHECK(r.records[i].values == s.records[i].values);
    CHECK(r.records[i].state == s.records[i].state);
  }
}

TEST_CASE("atomic file: a replacement leaves only the target; a failed one leaves it as it was") {
  TempDir dir;
  const auto path = dir.path() / "config.yaml";
  write_file_atomically(path, "old");
  write_file_atomically(path, "new");
  CHECK(read_text(path) == "new");
  CHECK(names_in(dir.path()) == std::set<std::string>{"config.yaml"});

  const auto fail_midway = [](AtomicFileWriter& file) {
    file.write("half", 4);
    throw std::runtime_error("disk full");
  };
  CHECK_THROWS_WITH_AS(write_file_atomically(path, fail_midway), "disk full", std::runtime_error);
  CHECK(read_text(path) == "new");
  CHECK(names_in(dir.path()) == std::set<std::string>{"config.yaml"});
}

TEST_CASE("snapshot: damaged files give errors naming the file and the problem") {
  TempDir dir;
  const auto path = dir.path() / "ps1.bin";
  write_snapshot(path, sample_snapshot());
  const auto good = read_bytes(path);
  SUBCASE("missing") {
    CHECK_THROWS_WITH_AS(read_snapshot(dir.path() / "nope.bin"), doctest::Contains("nope.bin"),
                         SnapshotError);
  }
  SUBCASE("every truncation") {
    for (std::size_t n = 0; n < good.size(); ++n) {
      write_bytes(path, {good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)});
      CHECK_THROWS_WITH_AS(read_snapshot(path), doctest::Contains(path.string().c_str()),
                           SnapshotError);
    }
  }
  SUBCASE("bad magic") {
    auto bad = good;
    bad[0] = 'X';
    write_bytes(path, bad);
    CHECK_THROWS_WITH_AS(read_snapshot(path), doctest::Contains("magic"), SnapshotError);
  }
  SUBCASE("flipped value byte") {
    auto bad = good;
    bad[good.size() - 14] ^= 0x40;  // inside the last record's only value (before the table count)
    write_bytes(path, bad);
    CHECK_THROWS_WITH_AS(read_snapshot(path), doctest::Contains("crc"), SnapshotError);
  }
  SUBCASE("flipped header byte") {
    auto bad = good;
    bad[12 + 4] ^= 0x01;  // inside the config hash
    write_bytes(path, bad);
    CHECK_THROWS_WITH_AS(read_snapshot(path), doctest::Contains("crc mismatch in the header"),
                         SnapshotError);
  }
  SUBCASE("huge declared value count") {
    auto bad = good;
    // File header (116 B with optimizer "momentum" and 2 workers), then
    // name length, name "dense0/w", chunk, version: the value count starts
    // at 140; make it about 2^39.
    bad[140 + 4] = '\x7f';
    write_bytes(path, bad);
    CHECK_THROWS_WITH_AS(read_snapshot(path), doctest::Contains("more than the file holds"),
                         SnapshotError);
  }
  SUBCASE("trailing garbage") {
    auto bad = good;
    bad.push_back('x');
    write_bytes(path, bad);
    CHECK_THROWS_WITH_AS(read_snapshot(path), doctest::Contains("after the last"), SnapshotError);
  }
}

TEST_CASE("snapshot: embedding tables read back identically, a damaged block is named") {
  TempDir dir;
  const auto path = dir.path() / "ps0.bin";
  TableSnapshot t;
  t.name = "emb";
  t.optimizer = "rowwise_adagrad";
  t.dim = 2;
  t.state_floats = 1;
  t.clock = 77;
  t.rows = {{5, 9}, {70, 77}, {1700000000, 1700000001}, {1, 2, 3, 4, 5, 6}};
  t.removed = {11, 12};
  const std::vector<TableRows> blocks = {{{5}, {70}, {1700000000}, {1, 2, 3}},
                                         {{9}, {77}, {1700000001}, {4, 5, 6}}};
  const TableSnapshotView view{t,
                               [&](const auto& emit) {
                                 for (const auto& b : blocks) emit(b);
                               },
                               t.removed};
  SnapshotInfo info;
  info.previous = 4;
  write_snapshot(path, info, {}, std::span(&view, 1));
  const auto r = read_snapshot(path);
  CHECK(r.previous == 4);
  REQUIRE(r.tables.size() == 1);
  const auto& got = r.tables[0];
  CHECK(got.name == t.name);
  CHECK(got.optimizer == t.optimizer);
  CHECK(got.dim == 2);
  CHECK(got.state_floats == 1);
  CHECK(got.clock == 77);
  CHECK(got.rows.keys == t.rows.keys);
  CHECK(got.rows.clocks == t.rows.clocks);
  CHECK(got.rows.seconds == t.rows.seconds);
  CHECK(got.rows.floats == t.rows.floats);
  CHECK(got.removed == t.removed);
  // A snapshot read back and written again keeps its tables.
  write_snapshot(dir.path() / "again.bin", r);
  const auto again = read_snapshot(dir.path() / "again.bin");
  REQUIRE(again.tables.size() == 1);
  CHECK(again.tables[0].rows.floats == t.rows.floats);
  CHECK(again.tables[0].removed == t.removed);

  auto bad = read_bytes(path);
  // The end: the second block's 3 values and crc, the empty block (12 B),
  // the removed keys (28 B).
  bad[bad.size() - 48] ^= 0x10;
  write_bytes(path, bad);
  CHECK_THROWS_WITH_AS(read_snapshot(path),
                       doctest::Contains("crc mismatch in block 1 of table 0 ('emb')"),
                       SnapshotError);
}
