// A shard's state as one message between two ps (server/shard_state.h), for
// re-join: chunks (values, optimizer state, versions), tables' rows (values,
// optimizer state, clocks), the mode's worker clocks and the record of
// applied requests arrive as they left, so the receiver answers a resend
// the sender applied from the record; what is not a shard's state is
// refused by name, and a record beyond its bounds is not taken.
#include <doctest/doctest.h>

#include <cstring>

#include "server/shard_state.h"
#include "tests/support/table_rows.h"

using namespace pstrain;
using namespace pstrain::ps;
using pstrain::testing::rows_of;

namespace {

wire::Header push(std::uint64_t incarnation, std::uint64_t id, std::uint32_t sender) {
  wire::Header h;
  h.op = wire::Op::push;
  h.incarnation = incarnation;
  h.request_id = id;
  h.sender = sender;
  return h;
}

}  // namespace

TEST_CASE("shard state: chunks and the record of applied requests arrive as they left") {
  OptimizerConfig momentum;
  momentum.kind = OptimizerKind::momentum;
  ChunkStore store(momentum);
  store.init("w", 0, std::vector<float>{1, 2, 3});
  store.init("w", 1, std::vector<float>{4});
  store.init("b", 0, std::vector<float>{-0.5f});
  store.push("w", 0, std::vector<float>{0.25f, -1, 3});
  store.push("w", 0, std::vector<float>{1, 1, 1});
  Dedup record;
  record.record(push(11, 5, 0), 2);
  record.record(push(11, 6, 0), 3);
  record.record(push(12, 9, 1), 1);
  // Two tables, rows with optimizer state (Adagrad) beside their values.
  RowOptimizerConfig adagrad;
  adagrad.lr = 0.5f;
  const std::vector<TableSpec> specs = {{"emb", 3, std::nullopt}, {"cat", 1, 100}};
  TableStore tables(specs, adagrad, {.seed = 4});
  const std::vector<std::uint64_t> keys = {3, 70, 1u << 20};
  tables.update("emb", keys, std::vector<float>(9, 0.5f), 10);
  tables.update("emb", std::vector<std::uint64_t>{70}, std::vector<float>{1, -2, 3}, 11);
  tables.update("cat", std::vector<std::uint64_t>{99}, std::vector<float>{-1}, 12);

  const auto bytes =
      encode_shard_state(store.refs(), &tables, std::vector<std::uint64_t>{4, 9}, record);
  auto state = decode_shard_state(bytes);
  CHECK(state.updates() == store.version_sum() + 3);  // three table pushes
  CHECK(state.rows() == 4);
  CHECK(state.clocks == std::vector<std::uint64_t>{4, 9});  // mode ssp's, per worker

  TableStore other_tables(specs, adagrad, {.seed = 4});
  for (const auto& t : state.tables) other_tables.replace(t);
  const auto a = tables.cut(CutKind::snapshot), b = other_tables.cut(CutKind::snapshot);
  for (std::size_t t = 0; t < specs.size(); ++t) {
    CAPTURE(specs[t].name);
    CHECK(a.views().at(t).header.clock == b.views().at(t).header.clock);
    CHECK(rows_of(a.views().at(t)) == rows_of(b.views().at(t)));
  }

  ChunkStore other(momentum);
  other.restore(std::move(state.chunks));
  for (const auto& held : store.refs()) {
    CAPTURE(held.name);
    CAPTURE(held.chunk);
    const Chunk* copy = other.find(held.name, held.chunk);
    REQUIRE(copy != nullptr);
    CHECK(*copy->values == *held.values);
    CHECK(*copy->state == *held.state);
    CHECK(copy->version == held.version);
  }
  Dedup restored;
  restored.restore(state.record);
  CHECK(restored.entries() == 3);
  const auto seen = restored.find(push(11, 6, 0));
  CHECK(seen.verdict == Dedup::Verdict::resent);
  CHECK(seen.version == 3);
  CHECK(restored.find(push(12, 9, 1)).verdict == Dedup::Verdict::resent);
  CHECK(restored.find(push(12, 10, 1)).verdict == Dedup::Verdict::fresh);
}

TEST_CASE("shard state: what is not one is refused by name") {
  ChunkStore store(OptimizerConfig{});
  store.init("w", 0, std::vector<float>{1, 2});
  auto bytes = encode_shard_state(store.refs(), nullptr, {}, Dedup());
  CHECK_THROWS_WITH_AS(decode_shard_state(std::vector<std::uint8_t>(16, 7)),
                       doctest::Contains("not a shard's state"), ShardStateError);
  auto cut = bytes;
  cut.resize(bytes.size() - 3);
  CHECK_THROWS_WITH_AS(decode_shard_state(cut), doctest::Contains("does not decode"),
                       ShardStateError);
  // A length that claims more than the bytes left sizes nothing.
  auto lying = bytes;
  const std::uint64_t huge = std::uint64_t{1} << 60;
  std::memcpy(lying.data() + sizeof(std::uint32_t), &huge, sizeof huge);
  CHECK_THROWS_WITH_AS(decode_shard_state(lying), doctest::Contains("declares"), ShardStateError);
  auto longer = bytes;
  longer.push_back(0);
  CHECK_THROWS_WITH_AS(decode_shard_state(longer), doctest::Contains("after its end"),
                       ShardStateError);
}

TEST_CASE("shard state: pieces put back together whole, once, in order") {
  std::vector<std::uint8_t> state(2 * kStatePieceBytes + 5);
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<std::uint8_t>(i * 7);
  REQUIRE(state_pieces(state.size()) == 3);
  CHECK(state_pieces(1) == 1);
  CHECK(state_piece(state, 2).size() == 5);
  StateAssembly a;
  CHECK(a.add(1, 0, state.size(), state_piece(state, 0)));
  CHECK_FALSE(a.add(1, 0, state.size(), state_piece(state, 0)));  // an answer sent again
  CHECK_FALSE(a.add(1, 2, state.size(), state_piece(state, 2)));  // ahead: asked for again
  CHECK(a.next() == 1);
  CHECK(a.add(1, 1, state.size(), state_piece(state, 1)));
  CHECK_FALSE(a.complete());
  CHECK(a.add(1, 2, state.size(), state_piece(state, 2)));
  REQUIRE(a.complete());
  CHECK(a.take() == state);
  CHECK(a.next() == 0);
  // A later piece of another cut drops what was held: from the start again.
  CHECK(a.add(1, 0, state.size(), state_piece(state, 0)));
  CHECK_FALSE(a.add(2, 1, state.size(), state_piece(state, 1)));
  CHECK(a.next() == 0);
  // A piece of the wrong size, or a state past the limit, is refused.
  CHECK(a.add(3, 0, state.size(), state_piece(state, 0)));
  CHECK_THROWS_WITH_AS(a.add(3, 1, state.size(), state_piece(state, 2)),
                       doctest::Contains("holds 5 bytes"), ShardStateError);
  CHECK(a.next() == 0);
  CHECK_THROWS_WITH_AS(a.add(4, 0, max_state_bytes() + 1, state_piece(state, 0)),
                       doctest::Contains("half this host's memory"), ShardStateError);
}

TEST_CASE("shard state: a record beyond the receiver's bounds is not taken") {
  Dedup big(4, 3);
  for (std::uint64_t c = 1; c <= 3; ++c)
    for (std::uint64_t id = 1; id <= 4; ++id) big.record(push(c, id, 0), id);
  Dedup fewer_clients(4, 2);
  CHECK_THROWS_AS(fewer_clients.restore(big.records()), std::invalid_argument);
  Dedup shorter_window(2, 3);
  CHECK_THROWS_AS(shorter_window.restore(big.records()), std::invalid_argument);
  CHECK(fewer_clients.entries() == 0);
}
