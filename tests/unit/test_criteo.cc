// The Criteo TSV reader on files the tests write: fields to features and
// ids, plain and gzip, the blocks dealt to workers, the held-out test
// blocks, malformed lines named or skipped, and the shards of a part.
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "client/data/criteo_reader.h"
#include "client/data/dataset.h"
#include "tests/support/child_process.h"

namespace fs = std::filesystem;
using namespace pstrain;

namespace {

struct Line {
  int label = 0;
  std::optional<std::int64_t> ints[kCtrDense];
  std::optional<std::uint64_t> cats[kCtrCategorical];
};

std::string text_of(const Line& line) {
  std::string out = std::to_string(line.label);
  for (const auto& v : line.ints) out += "\t" + (v ? std::to_string(*v) : "");
  char hex[24];
  for (const auto& v : line.cats) {
    out += "\t";
    if (v) {
      std::snprintf(hex, sizeof hex, "%08llx", static_cast<unsigned long long>(*v));
      out += hex;
    }
  }
  return out;
}

std::uint64_t next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// `count` lines of random fields, some empty, with I1 = the line's number
// (0-based), so that a sample says which line it came from.
std::vector<Line> random_lines(std::size_t count, std::uint64_t seed = 1) {
  std::vector<Line> lines(count);
  for (std::size_t i = 0; i < count; ++i) {
    Line& line = lines[i];
    line.label = static_cast<int>(next(seed) % 2);
    line.ints[0] = static_cast<std::int64_t>(i);
    for (std::size_t j = 1; j < kCtrDense; ++j)
      if (next(seed) % 5 != 0) line.ints[j] = static_cast<std::int64_t>(next(seed) % 1000) - 3;
    for (std::size_t f = 0; f < kCtrCategorical; ++f)
      if (next(seed) % 7 != 0) line.cats[f] = next(seed) % (f + 2) * 0x1000193;
  }
  return lines;
}

void write_file(const fs::path& path, const std::string& text) {
  if (path.extension() == ".gz") {
    gzFile file = gzopen(path.c_str(), "wb");
    REQUIRE(file != nullptr);
    REQUIRE(gzwrite(file, text.data(), static_cast<unsigned>(text.size())) ==
            static_cast<int>(text.size()));
    REQUIRE(gzclose(file) == Z_OK);
  } else {
    std::ofstream(path, std::ios::binary) << text;
  }
}

std::string joined(const std::vector<Line>& lines, const std::string& eol = "\n") {
  std::string out;
  for (const auto& line : lines) out += text_of(line) + eol;
  return out;
}

// The features, ids and label the reader must make of `line`.
void check_sample(const Dataset& data, std::size_t i, const Line& line, bool log_integers) {
  CHECK(data.labels[i] == line.label);
  for (std::size_t j = 0; j < kCtrDense; ++j) {
    const float expected = line.ints[j]
                               ? (log_integers ? static_cast<float>(std::log1p(std::max<double>(
                                                     static_cast<double>(*line.ints[j]), 0)))
                                               : static_cast<float>(*line.ints[j]))
                               : 0.0f;
    CHECK(data.image(i)[j] == expected);
  }
  for (std::size_t f = 0; f < kCtrCategorical; ++f)
    CHECK(data.sample_ids(i)[f] == (line.cats[f] ? ctr_id(f, *line.cats[f]) : ctr_missing_id(f)));
}

std::string error_of(const fs::path& path, const CriteoOptions& options, std::uint32_t worker = 0,
                     std::uint32_t workers = 1) {
  try {
    read_criteo(path, options, worker, workers);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

// The line number (I1) each sample came from, with log_integers off.
std::vector<std::size_t> line_numbers(const Dataset& data) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < data.size(); ++i)
    out.push_back(static_cast<std::size_t>(data.image(i)[0]));
  return out;
}

}  // namespace

TEST_CASE("criteo: ids are per field, one to one, and the dense transform is log(1 + x)") {
  std::set<std::uint64_t> ids;
  for (std::size_t f = 0; f < kCtrCategorical; ++f) {
    for (std::uint64_t v = 0; v < 100; ++v) ids.insert(ctr_id(f, v));
    ids.insert(ctr_missing_id(f));
  }
  CHECK(ids.size() == kCtrCategorical * 101);  // no two fields or values share an id
  CHECK(ctr_id(3, 0x68fd1e64) == ctr_id(3, 0x68fd1e64));
  CHECK(ctr_dense(0, true) == 0.0f);
  CHECK(ctr_dense(-3, true) == 0.0f);  // negative counts clamp to 0
  CHECK(ctr_dense(-3, false) == -3.0f);
  CHECK(ctr_dense(9, true) == static_cast<float>(std::log(10.0)));
  CHECK(ctr_dense(1000000, false) == 1000000.0f);
}

TEST_CASE("criteo: fields become features, ids and labels; empty fields, CRLF, no last newline") {
  TempDir dir;
  Line full;
  full.label = 1;
  for (std::size_t j = 0; j < kCtrDense; ++j) full.ints[j] = static_cast<std::int64_t>(j * j) - 2;
  for (std::size_t f = 0; f < kCtrCategorical; ++f) full.cats[f] = 0xabc00000 + f;
  const Line empty;  // label 0, every feature missing
  const auto lines = std::vector<Line>{full, empty, full};
  // Uppercase hex reads as lowercase; the last line has no '\n'.
  std::string text = text_of(full) + "\r\n" + text_of(empty) + "\r\n" + text_of(full);
  const auto upper = text.find("abc00000");
  text.replace(upper, 8, "ABC00000");
  const auto path = dir.path() / "small.txt";
  write_file(path, text);

  for (bool log : {true, false}) {
    CAPTURE(log);
    const Dataset data = read_criteo(path, {.log_integers = log});
    REQUIRE(data.size() == 3);
    CHECK(data.name == "criteo/train");
    CHECK(data.channels == 13);
    CHECK(data.height == 1);
    CHECK(data.width == 1);
    CHECK(data.classes == 2);
    CHECK(data.ids_per_sample == 26);
    CHECK(data.images.size() == 3 * 13);
    CHECK(data.ids.size() == 3 * 26);
    CHECK(data.part_size == 3);
    CHECK(data.skipped_lines == 0);
    for (std::size_t i = 0; i < 3; ++i) check_sample(data, i, lines[i], log);
  }
  // The test split of a test file: the whole file, part_size 0.
  const Dataset test = read_criteo(path, {.test_split = true});
  CHECK(test.name == "criteo/test");
  CHECK(test.size() == 3);
  CHECK(test.part_size == 0);
}

TEST_CASE("criteo: plain and gzip files read the same, across buffer boundaries") {
  TempDir dir;
  // About 2.5 MiB of text: lines straddle the 1 MiB read buffer.
  const auto lines = random_lines(14000);
  const std::string text = joined(lines);
  REQUIRE(text.size() > (2u << 20));
  write_file(dir.path() / "train.txt", text);
  write_file(dir.path() / "train.txt.gz", text);
  const Dataset plain = read_criteo(dir.path() / "train.txt", {});
  const Dataset gz = read_criteo(dir.path() / "train.txt.gz", {});
  REQUIRE(plain.size() == lines.size());
  CHECK(gz.labels == plain.labels);
  CHECK(gz.images == plain.images);
  CHECK(gz.ids == plain.ids);
  for (std::size_t i = 0; i < lines.size(); i += 997) check_sample(plain, i, lines[i], true);
  check_sample(plain, lines.size() - 1, lines.back(), true);
}

TEST_CASE("criteo: a gzip file cut short is an error, not a shorter last line") {
  TempDir dir;
  const std::string text = joined(random_lines(3000));
  write_file(dir.path() / "whole.gz", text);
  std::ifstream in(dir.path() / "whole.gz", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(read_criteo(dir.path() / "whole.gz", {}).size() == 3000);
  std::ofstream(dir.path() / "cut.gz", std::ios::binary) << bytes.substr(0, bytes.size() * 2 / 3);
  CHECK(error_of(dir.path() / "cut.gz", {}) ==
        "data: " + (dir.path() / "cut.gz").string() +
            ": the gzip stream ends early (a truncated file?)");
}

TEST_CASE("criteo: blocks of block_lines are dealt to the workers in turn") {
  TempDir dir;
  const std::size_t n = 100, block = 7;  // 15 blocks, the last of 2 lines
  const auto lines = random_lines(n);
  const auto path = dir.path() / "train.txt.gz";
  write_file(path, joined(lines));
  for (std::uint32_t workers = 1; workers <= 3; ++workers) {
    CAPTURE(workers);
    std::vector<std::size_t> counts(workers, 0);
    for (std::size_t l = 0; l < n; ++l) ++counts[l / block % workers];
    const std::size_t fewest = *std::min_element(counts.begin(), counts.end());
    std::vector<int> seen(n, 0);
    for (std::uint32_t w = 0; w < workers; ++w) {
      const Dataset part =
          read_criteo(path, {.block_lines = block, .log_integers = false}, w, workers);
      CHECK(part.size() == counts[w]);
      CHECK(part.part_size == fewest);
      const auto numbers = line_numbers(part);
      for (std::size_t i = 0; i < numbers.size(); ++i) {
        REQUIRE(numbers[i] < n);
        CHECK(numbers[i] / block % workers == w);       // its own block
        if (i > 0) CHECK(numbers[i] > numbers[i - 1]);  // in the file's order
        ++seen[numbers[i]];
        check_sample(part, i, lines[numbers[i]], false);
      }
      // The shard trains on the first part_size samples, in every epoch.
      const WorkerShard shard(part, w, workers, 5);
      CHECK(shard.size() == fewest);
      CHECK(shard.first() == 0);
      for (std::size_t i : shard.epoch_order(1)) CHECK(i < fewest);
    }
    CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(n));  // each line once
  }
  // A worker with no block at all.
  CHECK(error_of(path, {.block_lines = 60}, 0, 3).find("give worker 2 of 3 no block") !=
        std::string::npos);
}

TEST_CASE("criteo: test_fraction holds out whole blocks, disjoint from the training split") {
  TempDir dir;
  const std::size_t n = 1000, block = 10;
  const double fraction = 0.3;
  const auto path = dir.path() / "all.txt";
  write_file(path, joined(random_lines(n)));
  const CriteoOptions train_options{
      .block_lines = block, .test_fraction = fraction, .log_integers = false};
  CriteoOptions test_options = train_options;
  test_options.test_split = true;

  std::vector<std::size_t> test_blocks, train_blocks;
  for (std::size_t b = 0; b < n / block; ++b)
    (ctr_test_block(b, fraction) ? test_blocks : train_blocks).push_back(b);
  CHECK(test_blocks.size() > 15);  // about 30 of 100
  CHECK(test_blocks.size() < 45);

  // The evaluator's test split: every test block, whatever the worker.
  const Dataset test = read_criteo(path, test_options, 1, 2);
  CHECK(test.name == "criteo/test");
  CHECK(test.part_size == 0);
  CHECK(test.size() == test_blocks.size() * block);
  std::set<std::size_t> test_lines;
  for (std::size_t l : line_numbers(test)) {
    CHECK(ctr_test_block(l / block, fraction));
    test_lines.insert(l);
  }
  CHECK(test_lines.size() == test.size());

  for (std::uint32_t workers = 1; workers <= 3; ++workers) {
    CAPTURE(workers);
    std::vector<std::size_t> counts(workers, 0);
    for (std::size_t t = 0; t < train_blocks.size(); ++t) counts[t % workers] += block;
    const std::size_t fewest = *std::min_element(counts.begin(), counts.end());
    std::set<std::size_t> train_lines;
    for (std::uint32_t w = 0; w < workers; ++w) {
      const Dataset part = read_criteo(path, train_options, w, workers);
      CHECK(part.size() == counts[w]);
      for (std::size_t l : line_numbers(part)) {
        CHECK(test_lines.count(l) == 0);
        // The t-th training block goes to worker t mod workers.
        const auto t =
            std::find(train_blocks.begin(), train_blocks.end(), l / block) - train_blocks.begin();
        CHECK(static_cast<std::uint32_t>(t) % workers == w);
        CHECK(train_lines.insert(l).second);
      }
      CHECK(part.part_size == (workers == 1 ? part.size() : fewest));
    }
    CHECK(train_lines.size() + test_lines.size() == n);
  }
  // A larger fraction holds out the same blocks and more.
  const Dataset more = read_criteo(
      path,
      {.block_lines = block, .test_fraction = 0.6, .test_split = true, .log_integers = false});
  CHECK(more.size() > test.size());
  const auto more_lines = line_numbers(more);
  for (std::size_t l : test_lines)
    CHECK(std::find(more_lines.begin(), more_lines.end(), l) != more_lines.end());
}

TEST_CASE("criteo: a malformed line names the file, the line and the field") {
  TempDir dir;
  const auto good = random_lines(5);
  const std::string good_text = text_of(good[0]);
  const auto with_field = [&](std::size_t column, const std::string& value) {
    std::vector<std::string> fields;
    std::size_t start = 0;
    for (;;) {
      const auto tab = good_text.find('\t', start);
      fields.push_back(good_text.substr(start, tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    fields[column] = value;
    std::string out;
    for (std::size_t i = 0; i < fields.size(); ++i) out += (i ? "\t" : "") + fields[i];
    return out;
  };
  struct Case {
    std::string line, expected;
  };
  const std::vector<Case> cases = {
      {with_field(0, "2"), "label: expected 0 or 1, got '2'"},
      {with_field(0, ""), "label: expected 0 or 1, got ''"},
      {with_field(0, "1.0"), "label: expected 0 or 1, got '1.0'"},
      {with_field(5, "abc"), "I5: expected an integer, got 'abc'"},
      {with_field(1, "1.5"), "I1: expected an integer, got '1.5'"},
      {with_field(13, "99999999999999999999"),
       "I13: integer '99999999999999999999' is out of range"},
      {with_field(14, "xyz"), "C1: expected 1 to 16 hexadecimal digits, got 'xyz'"},
      {with_field(25, "0123456789abcdef0"),
       "C12: expected 1 to 16 hexadecimal digits, got '0123456789abcdef0'"},
      {with_field(39, "12 "), "C26: expected 1 to 16 hexadecimal digits, got '12 '"},
      {good_text.substr(0, good_text.rfind('\t')),
       "has 39 tab-separated fields, expected 40 (label, I1..I13, C1..C26)"},
      {good_text + "\t", "has 41 tab-separated fields, expected 40"},
      {"", "has 1 tab-separated field, expected 40"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.line);
    const auto path = dir.path() / "bad.txt";
    // The bad line is line 3.
    write_file(path, text_of(good[1]) + "\n" + text_of(good[2]) + "\n" + c.line + "\n" +
                         text_of(good[3]) + "\n");
    const std::string message = error_of(path, {});
    CHECK(message.find("data: " + path.string() + ":3: " + c.expected) == 0);
    CHECK(message.find("data.skip_bad_lines") != std::string::npos);
    // Skipped, it is counted and the other lines are read.
    const Dataset skipped = read_criteo(path, {.skip_bad_lines = true});
    CHECK(skipped.skipped_lines == 1);
    CHECK(skipped.size() == 3);
    CHECK(skipped.part_size == 3);
  }
  // A worker parses only its own blocks: line 6 is in block 1, worker 1's.
  const auto path = dir.path() / "blocks.txt";
  write_file(path, joined(good) + cases[0].line + "\n" + joined(good));
  CHECK(error_of(path, {.block_lines = 5}, 0, 2).empty());
  CHECK(error_of(path, {.block_lines = 5}, 1, 2).find(path.string() + ":6: label:") !=
        std::string::npos);
}

TEST_CASE("criteo: skipped lines are counted, and a short worker repeats its own samples") {
  TempDir dir;
  auto lines = random_lines(20);
  std::string text;
  for (std::size_t l = 0; l < lines.size(); ++l) {
    // Lines 1, 3 and 11 (worker 0's blocks 0 and 2 of 5 lines) are bad.
    text += (l == 1 || l == 3 || l == 11 ? "x" + text_of(lines[l]).substr(1) : text_of(lines[l])) +
            "\n";
  }
  const auto path = dir.path() / "train.txt";
  write_file(path, text);
  const CriteoOptions options{.block_lines = 5, .skip_bad_lines = true, .log_integers = false};
  const Dataset w0 = read_criteo(path, options, 0, 2);
  CHECK(w0.skipped_lines == 3);
  CHECK(w0.part_size == 10);  // both workers' blocks hold 10 lines
  REQUIRE(w0.size() == 10);   // 7 good samples, then the first 3 again
  const auto numbers = line_numbers(w0);
  CHECK(numbers == std::vector<std::size_t>{0, 2, 4, 10, 12, 13, 14, 0, 2, 4});
  CHECK(std::vector<std::int32_t>(w0.labels.begin() + 7, w0.labels.end()) ==
        std::vector<std::int32_t>(w0.labels.begin(), w0.labels.begin() + 3));
  CHECK(std::vector<std::uint64_t>(w0.ids.begin() + 7 * 26, w0.ids.end()) ==
        std::vector<std::uint64_t>(w0.ids.begin(), w0.ids.begin() + 3 * 26));
  const Dataset w1 = read_criteo(path, options, 1, 2);
  CHECK(w1.skipped_lines == 0);
  CHECK(w1.size() == 10);
  CHECK(w1.part_size == 10);
  // Every line of a part bad: nothing to train on.
  write_file(path, "x\ny\n");
  CHECK(error_of(path, {.skip_bad_lines = true})
            .find("every line of worker 0's blocks is "
                  "malformed") != std::string::npos);
}

TEST_CASE("criteo: a missing file is named, with where to get the data") {
  TempDir dir;
  const auto missing = dir.path() / "train.txt";
  CHECK(error_of(missing, {}) ==
        "data: " + missing.string() +
            ": no such file; docs/ctr.md says where to get Criteo's files");
  CHECK(error_of(dir.path(), {}).find("is a directory") != std::string::npos);
  write_file(missing, "");
  CHECK(error_of(missing, {}).find("give worker 0 of 1 no block") != std::string::npos);
  CHECK(error_of(missing, {.test_split = true}).find("no test samples") != std::string::npos);
}

TEST_CASE("criteo: load_dataset reads data.train as the worker's part, the test split whole") {
  TempDir dir;
  const auto lines = random_lines(300);
  write_file(dir.path() / "train.txt.gz", joined(lines));
  write_file(dir.path() / "test.txt", joined(random_lines(50, 9)));
  DataConfig config;
  config.name = "criteo";
  config.train = dir.path() / "train.txt.gz";
  config.test = dir.path() / "test.txt";
  config.block_lines = 16;
  const Dataset part = load_dataset(config, true, 1, 3);
  CHECK(part.name == "criteo/train");
  // 19 blocks, the last of 12 lines: worker 0 has 7 (108 lines), 1 and 2
  // have 6 (96 lines).
  CHECK(part.size() == 96);
  CHECK(part.part_size == 96);
  CHECK(load_dataset(config, true, 0, 3).size() == 108);
  CHECK(load_dataset(config, true, 0, 3).part_size == 96);
  const Dataset test = load_dataset(config, false, 1, 3);
  CHECK(test.name == "criteo/test");
  CHECK(test.size() == 50);
  CHECK(test.part_size == 0);

  config.test_fraction = 0.5;
  config.test.clear();
  const Dataset held_out = load_dataset(config, false, 0, 3);
  CHECK(held_out.size() > 0);
  CHECK(held_out.size() < 300);

  config.train.clear();
  CHECK_THROWS_WITH_AS(
      load_dataset(config, true),
      "data: criteo needs data.train, the file of its training split (docs/ctr.md)", DataError);
}

TEST_CASE("shards: a part read by the loader trains on its first part_size samples") {
  Dataset data = make_synthetic(7, true);
  data.part_size = 5;
  for (std::uint32_t w = 0; w < 3; ++w) {
    WorkerShard shard(data, w, 3, 1);
    CHECK(shard.size() == 5);
    CHECK(shard.first() == 0);
    auto order = shard.epoch_order(0);
    std::sort(order.begin(), order.end());
    CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 4});
  }
  // The order still depends on the worker.
  CHECK(WorkerShard(data, 0, 3, 1).epoch_order(0) != WorkerShard(data, 1, 3, 1).epoch_order(0));
  data.part_size = 8;
  CHECK_THROWS_AS(WorkerShard(data, 0, 3, 1), std::invalid_argument);
}
