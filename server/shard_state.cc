#include "server/shard_state.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "shared/protocol.h"

namespace pstrain::ps {

namespace {

// Told apart from anything else a frame may hold.
constexpr std::uint32_t kMagic = 0x50535353;  // "PSSS"

// Layout (native byte order: both ends are ps of one build): magic | u64
// chunk count | per chunk: u32 name length, name, u32 chunk, u64 version,
// u64 value count, u64 state count, f32 values, f32 state | u64 client
// count | per client: u64 incarnation, u32 sender, u64 evicted_below, u64
// applied count, (u64 request id, u64 version) per applied request | u64
// table count | per table: u32 name length, name, u32 optimizer name
// length, name, u32 dim, u32 state floats, u64 clock, u64 row count, per
// row: u64 key, u64 clock, u32 second, f32 values then state | u64 worker
// clock count, u64 clocks.
class Writer {
 public:
  explicit Writer(std::size_t bytes) { out_.reserve(bytes); }
  void put_string(const std::string& v) {
    put(static_cast<std::uint32_t>(v.size()));
    put_bytes(v.data(), v.size());
  }
  std::size_t size() const { return out_.size(); }
  // Overwrites what put(v) wrote at `at`.
  template <class T>
  void patch(std::size_t at, const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::memcpy(out_.data() + at, &v, sizeof v);
  }
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put_bytes(&v, sizeof v);
  }
  void put_bytes(const void* p, std::size_t n) {
    if (n == 0) return;
    const auto* b = static_cast<const std::uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::uint8_t> take() { return std::move(out_); }

 private:
  std::vector<std::uint8_t> out_;
};

// Every length is checked against the bytes left before anything is sized
// by it: the bytes come from another process.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) : in_(in) {}
  template <class T>
  T get() {
    T v;
    get_bytes(&v, sizeof v);
    return v;
  }
  void get_bytes(void* p, std::size_t n) {
    if (n == 0) return;  // p may be an empty vector's null data()
    need(n, 1);
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }
  // `count` items of `size` bytes each follow: throws unless they fit.
  void need(std::uint64_t count, std::size_t size) const {
    if (count > (in_.size() - at_) / size)
      throw ShardStateError("a shard's state that does not decode: it declares " +
                            std::to_string(count) + " items of " + std::to_string(size) +
                            " bytes at offset " + std::to_string(at_) + ", where " +
                            std::to_string(in_.size() - at_) + " bytes remain");
  }
  template <class T>
  void get_vector(std::vector<T>& v, std::uint64_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(count, sizeof(T));
    v.resize(count);
    get_bytes(v.data(), count * sizeof(T));
  }
  std::string get_string() {
    const auto n = get<std::uint32_t>();
    need(n, 1);
    std::string v(n, '\0');
    get_bytes(v.data(), n);
    return v;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  std::span<const std::uint8_t> in_;
  std::size_t at_ = 0;
};

}  // namespace

std::uint64_t ShardState::updates() const {
  std::uint64_t sum = 0;
  for (const auto& c : chunks) sum += c.version;
  for (const auto& t : tables) sum += t.clock;
  return sum;
}

std::uint64_t ShardState::rows() const {
  std::uint64_t sum = 0;
  for (const auto& t : tables) sum += t.rows.keys.size();
  return sum;
}

std::vector<std::uint8_t> encode_shard_state(const std::vector<HeldChunk>& chunks,
                                             TableStore* tables,
                                             std::span<const std::uint64_t> clocks,
                                             const Dedup& record) {
  const auto clients = record.records();
  const auto headers = tables ? tables->headers() : std::vector<TableHeader>{};
  // The size first, so that a shard too large for one message costs no copy.
  std::size_t bytes = sizeof kMagic + 4 * sizeof(std::uint64_t) + 8 * clocks.size();
  for (const auto& c : chunks)
    bytes +=
        4 + c.name.size() + 4 + 3 * 8 + 4 * (c.values->size() + (c.state ? c.state->size() : 0));
  for (const auto& c : clients) bytes += 3 * 8 + 4 + 16 * c.applied.size();
  for (const auto& h : headers)
    bytes += 4 + h.name.size() + 4 + h.optimizer.size() + 2 * 4 + 2 * 8 +
             tables->rows(h.name) * (8 + 8 + 4 + 4 * h.row_floats());
  if (bytes > max_state_bytes())
    throw ShardStateError("the shard's state is " + std::to_string(bytes) +
                          " bytes, more than the " + std::to_string(max_state_bytes()) +
                          " a ps sends (half this host's memory)");
  Writer w(bytes);
  w.put(kMagic);
  w.put(static_cast<std::uint64_t>(chunks.size()));
  for (const auto& c : chunks) {
    w.put(static_cast<std::uint32_t>(c.name.size()));
    w.put_bytes(c.name.data(), c.name.size());
    w.put(c.chunk);
    w.put(c.version);
    const std::uint64_t state = c.state ? c.state->size() : 0;
    w.put(static_cast<std::uint64_t>(c.values->size()));
    w.put(state);
    w.put_bytes(c.values->data(), c.values->size() * sizeof(float));
    if (state) w.put_bytes(c.state->data(), state * sizeof(float));
  }
  w.put(static_cast<std::uint64_t>(clients.size()));
  for (const auto& c : clients) {
    w.put(c.incarnation);
    w.put(c.sender);
    w.put(c.evicted_below);
    w.put(static_cast<std::uint64_t>(c.applied.size()));
    for (const auto& [id, version] : c.applied) {
      w.put(id);
      w.put(version);
    }
  }
  w.put(static_cast<std::uint64_t>(headers.size()));
  if (tables) {
    const auto cut = tables->cut(CutKind::snapshot);
    for (const auto& view : cut.views()) {
      const auto& h = view.header;
      w.put_string(h.name);
      w.put_string(h.optimizer);
      w.put(h.dim);
      w.put(h.state_floats);
      w.put(h.clock);
      // The count is known once the cut's blocks are read.
      const auto count_at = w.size();
      w.put(std::uint64_t{0});
      std::uint64_t count = 0;
      view.rows([&](const TableRows& block) {
        for (std::size_t i = 0; i < block.keys.size(); ++i) {
          w.put(block.keys[i]);
          w.put(block.clocks[i]);
          w.put(block.seconds[i]);
          w.put_bytes(block.floats.data() + i * h.row_floats(), h.row_floats() * sizeof(float));
        }
        count += block.keys.size();
      });
      w.patch(count_at, count);
    }
  }
  w.put(static_cast<std::uint64_t>(clocks.size()));
  w.put_bytes(clocks.data(), clocks.size() * sizeof(std::uint64_t));
  return w.take();
}

ShardState decode_shard_state(std::span<const std::uint8_t> bytes) {
  Reader r(bytes);
  ShardState state;
  if (bytes.size() < sizeof kMagic || r.get<std::uint32_t>() != kMagic)
    throw ShardStateError("not a shard's state (its first bytes differ)");
  const auto chunks = r.get<std::uint64_t>();
  r.need(chunks, 4 + 4 + 3 * 8);  // the smallest chunk record
  state.chunks.resize(chunks);
  for (auto& c : state.chunks) {
    const auto name = r.get<std::uint32_t>();
    r.need(name, 1);
    c.name.resize(name);
    r.get_bytes(c.name.data(), name);
    c.chunk = r.get<std::uint32_t>();
    c.version = r.get<std::uint64_t>();
    const auto values = r.get<std::uint64_t>();
    const auto optimizer_state = r.get<std::uint64_t>();
    r.get_vector(c.values, values);
    r.get_vector(c.state, optimizer_state);
  }
  const auto clients = r.get<std::uint64_t>();
  r.need(clients, 3 * 8 + 4);
  state.record.resize(clients);
  for (auto& c : state.record) {
    c.incarnation = r.get<std::uint64_t>();
    c.sender = r.get<std::uint32_t>();
    c.evicted_below = r.get<std::uint64_t>();
    const auto applied = r.get<std::uint64_t>();
    r.need(applied, 2 * 8);
    c.applied.resize(applied);
    for (auto& [id, version] : c.applied) {
      id = r.get<std::uint64_t>();
      version = r.get<std::uint64_t>();
    }
  }
  const auto tables = r.get<std::uint64_t>();
  r.need(tables, 2 * 4 + 2 * 4 + 2 * 8);  // the smallest table record
  // One at a time: a count that the bytes allow still sizes nothing ahead.
  for (std::uint64_t i = 0; i < tables; ++i) {
    auto& t = state.tables.emplace_back();
    t.name = r.get_string();
    t.optimizer = r.get_string();
    t.dim = r.get<std::uint32_t>();
    t.state_floats = r.get<std::uint32_t>();
    t.clock = r.get<std::uint64_t>();
    const std::size_t floats = t.row_floats();  // of two u32: no overflow in 64 bits
    if (floats == 0) throw ShardStateError("a shard's state with a table of rows of 0 floats");
    const auto rows = r.get<std::uint64_t>();
    r.need(rows, 8 + 8 + 4 + 4 * floats);
    t.rows.keys.resize(rows);
    t.rows.clocks.resize(rows);
    t.rows.seconds.resize(rows);
    t.rows.floats.resize(rows * floats);
    for (std::uint64_t i = 0; i < rows; ++i) {
      t.rows.keys[i] = r.get<std::uint64_t>();
      t.rows.clocks[i] = r.get<std::uint64_t>();
      t.rows.seconds[i] = r.get<std::uint32_t>();
      r.get_bytes(t.rows.floats.data() + i * floats, floats * sizeof(float));
    }
  }
  r.get_vector(state.clocks, r.get<std::uint64_t>());
  if (!r.done()) throw ShardStateError("a shard's state with bytes after its end");
  return state;
}

std::uint64_t max_state_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::uint64_t{1} << 32;  // unknown: 4 GiB
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}

std::size_t state_pieces(std::size_t bytes) {
  return std::max<std::size_t>(1, (bytes + kStatePieceBytes - 1) / kStatePieceBytes);
}

std::span<const std::uint8_t> state_piece(std::span<const std::uint8_t> state, std::size_t index) {
  const std::size_t at = std::min(state.size(), index * kStatePieceBytes);
  return state.subspan(at, std::min(kStatePieceBytes, state.size() - at));
}

bool StateAssembly::add(std::uint64_t transfer, std::uint64_t index, std::uint64_t total,
                        std::span<const std::uint8_t> bytes) {
  if (index == 0 && (!started_ || transfer != transfer_)) {
    clear();
    if (total == 0 || total > max_state_bytes())
      throw ShardStateError("a shard's state of " + std::to_string(total) +
                            " bytes, more than the " + std::to_string(max_state_bytes()) +
                            " a ps takes (half this host's memory)");
    started_ = true;
    transfer_ = transfer;
    total_ = total;
    bytes_.reserve(total);
  }
  if (started_ && transfer != transfer_) {
    clear();  // the sender cut its state afresh: asked for from the start
    return false;
  }
  if (!started_ || index != next_) return false;
  const auto expected = std::min<std::uint64_t>(kStatePieceBytes, total_ - bytes_.size());
  if (total != total_ || bytes.size() != expected) {
    const auto why = "piece " + std::to_string(index) + " of a shard's state of " +
                     std::to_string(total_) + " bytes holds " + std::to_string(bytes.size()) +
                     " bytes (of a state of " + std::to_string(total) + "), not " +
                     std::to_string(expected);
    clear();
    throw ShardStateError(why);
  }
  bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
  ++next_;
  return true;
}

std::vector<std::uint8_t> StateAssembly::take() {
  auto out = std::move(bytes_);
  clear();
  return out;
}

void StateAssembly::clear() {
  started_ = false;
  transfer_ = total_ = next_ = 0;
  bytes_ = {};
}

}  // namespace pstrain::ps
