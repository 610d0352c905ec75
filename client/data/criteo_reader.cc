#include "client/data/criteo_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "shared/log.h"

namespace pstrain {

float ctr_dense(std::int64_t value, bool log_integers) {
  if (!log_integers) return static_cast<float>(value);
  return static_cast<float>(std::log1p(static_cast<double>(std::max<std::int64_t>(value, 0))));
}

bool ctr_test_block(std::uint64_t block, double test_fraction) {
  // The hash's top 53 bits as a number in [0, 1).
  return static_cast<double>(ctr_block_hash(block) >> 11) * 0x1.0p-53 < test_fraction;
}

namespace {

constexpr std::size_t kBufferBytes = 1 << 20;
const char* const kCtrHint = "; docs/ctr.md says where to get Criteo's files";

std::string column_name(std::size_t column) {
  if (column == 0) return "label";
  if (column <= kCtrDense) return "I" + std::to_string(column);
  return "C" + std::to_string(column - kCtrDense);
}

// A field's text as an error message shows it: quoted, long ones cut.
std::string quoted(std::string_view text) {
  constexpr std::size_t kMax = 40;
  if (text.size() > kMax) return "'" + std::string(text.substr(0, kMax)) + "...'";
  return "'" + std::string(text) + "'";
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One parsed line.
struct Row {
  std::int32_t label = 0;
  float dense[kCtrDense];
  std::uint64_t ids[kCtrCategorical];
};

// Parses [begin, end) (without its '\n'; a trailing '\r' is dropped). Returns
// "" and fills `row`, or says what is wrong: "FIELD: what" or the field count.
std::string parse_line(const char* begin, const char* end, bool log_integers, Row& row) {
  if (end > begin && end[-1] == '\r') --end;
  const char* p = begin;
  for (std::size_t column = 0; column < kCtrColumns; ++column) {
    const bool last = column + 1 == kCtrColumns;
    const auto* tab =
        static_cast<const char*>(std::memchr(p, '\t', static_cast<std::size_t>(end - p)));
    if (last != (tab == nullptr)) {
      const auto fields = std::count(begin, end, '\t') + 1;
      return "has " + std::to_string(fields) + " tab-separated field" + (fields == 1 ? "" : "s") +
             ", expected " + std::to_string(kCtrColumns) + " (label, I1..I13, C1..C26)";
    }
    const char* field_end = last ? end : tab;
    const std::string_view text(p, static_cast<std::size_t>(field_end - p));
    if (column == 0) {
      if (text != "0" && text != "1") return "label: expected 0 or 1, got " + quoted(text);
      row.label = text[0] - '0';
    } else if (column <= kCtrDense) {
      std::int64_t value = 0;
      if (!text.empty()) {
        const auto [at, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec == std::errc::result_out_of_range)
          return column_name(column) + ": integer " + quoted(text) + " is out of range";
        if (ec != std::errc() || at != text.data() + text.size())
          return column_name(column) + ": expected an integer, got " + quoted(text);
      }
      row.dense[column - 1] = ctr_dense(value, log_integers);
    } else {
      const std::size_t field = column - 1 - kCtrDense;
      if (text.empty()) {
        row.ids[field] = ctr_missing_id(field);
      } else {
        std::uint64_t value = 0;
        bool hex = text.size() <= 16;
        for (std::size_t i = 0; hex && i < text.size(); ++i) {
          const int digit = hex_digit(text[i]);
          hex = digit >= 0;
          value = value << 4 | static_cast<std::uint64_t>(digit < 0 ? 0 : digit);
        }
        if (!hex)
          return column_name(column) + ": expected 1 to 16 hexadecimal digits, got " + quoted(text);
        row.ids[field] = ctr_id(field, value);
      }
    }
    p = field_end + 1;
  }
  return "";
}

class GzReader {
 public:
  explicit GzReader(const std::filesystem::path& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      throw DataError("data: " + path.string() + ": no such file" + kCtrHint);
    if (std::filesystem::is_directory(path, ec))
      throw DataError("data: " + path.string() + ": is a directory, expected a Criteo TSV file" +
                      kCtrHint);
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr)
      throw DataError("data: " + path.string() + ": cannot open (" +
                      std::generic_category().message(errno) + ")" + kCtrHint);
    gzbuffer(file_, 256 * 1024);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Up to `size` bytes; 0 at the end. A gzip stream cut short ends with
  // zlib's Z_BUF_ERROR rather than an error return: its last line would be
  // read as a whole one, so it throws too.
  std::size_t read(char* buffer, std::size_t size) {
    const int n = gzread(file_, buffer, static_cast<unsigned>(size));
    int code = Z_OK;
    const char* what = gzerror(file_, &code);
    if (n < 0 || (n == 0 && code == Z_BUF_ERROR))
      throw DataError("data: " + path_.string() + ": " +
                      (code == Z_BUF_ERROR
                           ? std::string("the gzip stream ends early (a truncated file?)")
                           : "read error (" +
                                 (code == Z_ERRNO ? std::generic_category().message(errno)
                                                  : std::string(what)) +
                                 ")"));
    return static_cast<std::size_t>(n);
  }

 private:
  std::filesystem::path path_;
  gzFile file_ = nullptr;
};

}  // namespace

Dataset ctr_dataset(std::string name) {
  Dataset data;
  data.name = std::move(name);
  data.channels = static_cast<int>(kCtrDense);
  data.height = data.width = 1;
  data.classes = 2;
  data.ids_per_sample = kCtrCategorical;
  return data;
}

Dataset read_criteo(const std::filesystem::path& path, const CriteoOptions& options,
                    std::uint32_t worker, std::uint32_t workers) {
  if (workers == 0 || worker >= workers)
    throw std::invalid_argument("data: worker " + std::to_string(worker) + " is not one of " +
                                std::to_string(workers) + " workers");
  if (options.block_lines == 0) throw std::invalid_argument("data: block_lines must be >= 1");
  const bool test_split = options.test_split;
  const double fraction = options.test_fraction;
  if (!(fraction >= 0 && fraction < 1))
    throw std::invalid_argument("data: test_fraction must be in [0, 1)");

  Dataset data = ctr_dataset(test_split ? "criteo/test" : "criteo/train");

  // Where the current line's block falls.
  std::uint64_t block = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t train_blocks = 0;  // training blocks before the current one
  bool in_split = false, mine = false;
  std::uint32_t owner = 0;
  std::vector<std::uint64_t> lines_of(workers, 0);  // training lines of each worker
  std::uint64_t line = 0;                           // the current line's 0-based number
  std::string first_error;
  Row row;

  const auto begin_line = [&] {
    const std::uint64_t b = line / options.block_lines;
    if (b == block) return;
    block = b;
    const bool test_block = fraction > 0 ? ctr_test_block(b, fraction) : test_split;
    in_split = test_block == test_split;
    if (!in_split) {
      mine = false;
    } else if (test_split) {
      mine = true;
    } else {
      owner = static_cast<std::uint32_t>((fraction > 0 ? train_blocks++ : b) % workers);
      mine = owner == worker;
    }
  };
  const auto handle = [&](const char* begin, const char* end) {
    std::string error = parse_line(begin, end, options.log_integers, row);
    if (error.empty()) {
      data.labels.push_back(row.label);
      data.images.insert(data.images.end(), row.dense, row.dense + kCtrDense);
      data.ids.insert(data.ids.end(), row.ids, row.ids + kCtrCategorical);
      return;
    }
    error = path.string() + ":" + std::to_string(line + 1) + ": " + error;
    if (!options.skip_bad_lines)
      throw DataError("data: " + error + " (data.skip_bad_lines: true skips such lines)");
    if (data.skipped_lines++ == 0) first_error = error;
  };
  const auto end_line = [&] {
    if (in_split && !test_split) ++lines_of[owner];
    ++line;
  };

  GzReader file(path);
  std::vector<char> buffer(kBufferBytes);
  std::string carry;     // the start of an own line cut by the buffer's end
  bool started = false;  // bytes of the current line have been seen
  while (const std::size_t n = file.read(buffer.data(), buffer.size())) {
    const char* p = buffer.data();
    const char* const end = p + n;
    while (p < end) {
      if (!started) {
        begin_line();
        started = true;
      }
      const auto* newline =
          static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
      if (newline == nullptr) {
        if (mine) carry.append(p, end);
        break;
      }
      if (mine) {
        if (carry.empty()) {
          handle(p, newline);
        } else {
          carry.append(p, newline);
          handle(carry.data(), carry.data() + carry.size());
          carry.clear();
        }
      }
      end_line();
      started = false;
      p = newline + 1;
    }
  }
  if (started) {  // a last line without '\n'
    if (mine) handle(carry.data(), carry.data() + carry.size());
    end_line();
  }

  if (data.skipped_lines > 0)
    log("data: ", path.string(), ": skipped ", data.skipped_lines, " malformed line",
        data.skipped_lines == 1 ? "" : "s", " of ",
        test_split ? "the test split" : "this worker's part", " (the first: ", first_error, ")");
  const std::string lines_text = std::to_string(line) + " line" + (line == 1 ? "" : "s");
  if (test_split) {
    if (data.size() == 0)
      throw DataError("data: " + path.string() + ": no test samples in its " + lines_text +
                      (fraction > 0 ? " (no block of data.block_lines lines fell to the test "
                                      "split at data.test_fraction " +
                                          std::to_string(fraction) + ")"
                                    : "") +
                      (data.skipped_lines > 0 ? " (every line skipped)" : ""));
    return data;
  }
  const std::uint64_t fewest = *std::min_element(lines_of.begin(), lines_of.end());
  if (fewest == 0)
    throw DataError(
        "data: " + path.string() + ": its " + lines_text + " of training data (" +
        std::to_string(options.block_lines) + " per block) give worker " +
        std::to_string(std::min_element(lines_of.begin(), lines_of.end()) - lines_of.begin()) +
        " of " + std::to_string(workers) +
        " no block; lower data.block_lines or use fewer workers");
  if (data.size() == 0)
    throw DataError("data: " + path.string() + ": every line of worker " + std::to_string(worker) +
                    "'s blocks is malformed (the first: " + first_error + ")");
  // One worker has nobody to keep pace with: its samples are its part.
  data.part_size = workers == 1 ? data.size() : static_cast<std::size_t>(fewest);
  if (data.size() < data.part_size) {
    const std::size_t have = data.size(), missing = data.part_size - have;
    log("data: ", path.string(), ": worker ", worker, " has ", have, " good samples of the ",
        data.part_size, " every worker trains on; repeating ", missing,
        " of its own from the first");
    data.labels.resize(data.part_size);
    data.images.resize(data.part_size * kCtrDense);
    data.ids.resize(data.part_size * kCtrCategorical);
    for (std::size_t i = have; i < data.part_size; ++i) {
      const std::size_t from = (i - have) % have;
      data.labels[i] = data.labels[from];
      std::copy_n(data.images.data() + from * kCtrDense, kCtrDense,
                  data.images.data() + i * kCtrDense);
      std::copy_n(data.ids.data() + from * kCtrCategorical, kCtrCategorical,
                  data.ids.data() + i * kCtrCategorical);
    }
  }
  return data;
}

}  // namespace pstrain
