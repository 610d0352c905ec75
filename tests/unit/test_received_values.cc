// Replies read where they came (client/ps/received_values.h): a chunk's
// float32 payload is kept in its ZeroMQ message and read from there (the
// same address, no copy), a payload not aligned for floats goes into the
// buffer instead, and every kept message is counted until it is let go.
#include <doctest/doctest.h>

#include <cstring>
#include <stdexcept>
#include <vector>
#include <zmq.hpp>

#include "client/ps/received_values.h"

using namespace pstrain;

namespace {

zmq::message_t message_of(const std::vector<float>& values) {
  return zmq::message_t(values.data(), values.size() * sizeof(float));
}

std::vector<float> joined(const ReceivedValues& r) {
  std::vector<float> out;
  for (const auto& piece : r.pieces()) out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

}  // namespace

TEST_CASE("received values: kept in their messages, read in place, counted until released") {
  const auto before = ReceivedValues::kept_in_process();
  // Chunk [2, 66) kept: its values are read from the message itself (one
  // of more than ZeroMQ's 33 bytes, whose data is not inside the message
  // object: a small one's moves with it, and is read from where it went).
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i + 3);
  ReceivedValues r(66);
  // Nothing received yet: no values to read, and no buffer.
  CHECK_THROWS_AS(r.pieces(), std::logic_error);
  CHECK(r.buffer_bytes() == 0);
  auto tail = message_of(values);
  const void* where = tail.data();
  REQUIRE(r.keep(2, 64, tail));
  CHECK(tail.size() == 0);       // taken
  CHECK(r.buffer_bytes() == 0);  // kept values need none
  // Chunk [0, 2) copied into the buffer (as a 16-bit payload is).
  const std::vector<float> head{1, 2};
  std::memcpy(r.buffer_for(0, 2).data(), head.data(), sizeof(float) * 2);
  CHECK(r.buffer_bytes() == 66 * sizeof(float));
  const auto pieces = r.pieces();
  REQUIRE(pieces.size() == 2);
  CHECK(static_cast<const void*>(pieces[1].data()) == where);
  std::vector<float> expected = head;
  expected.insert(expected.end(), values.begin(), values.end());
  CHECK(joined(r) == expected);
  CHECK(r.kept() == 1);
  CHECK(ReceivedValues::kept_in_process() == before + 1);
  // The chunk received again replaces its message.
  for (auto& v : values) v = -v;
  auto again = message_of(values);
  REQUIRE(r.keep(2, 64, again));
  CHECK(r.kept() == 1);
  CHECK(ReceivedValues::kept_in_process() == before + 1);
  CHECK(joined(r)[2] == -3);
  // Moved, the messages go with the values.
  ReceivedValues moved(std::move(r));
  CHECK(moved.kept() == 1);
  CHECK(ReceivedValues::kept_in_process() == before + 1);
  moved.release();
  CHECK(moved.kept() == 0);
  CHECK(ReceivedValues::kept_in_process() == before);
  {
    // A small message, read where it went.
    ReceivedValues dropped(3);
    auto m = message_of({1, 2, 3});
    REQUIRE(dropped.keep(0, 3, m));
    CHECK(joined(dropped) == std::vector<float>{1, 2, 3});
    CHECK(ReceivedValues::kept_in_process() == before + 1);
  }
  CHECK(ReceivedValues::kept_in_process() == before);
}

TEST_CASE("received values: what cannot be read in place is left to copy") {
  ReceivedValues r(4);
  // A payload at an address not aligned for floats.
  std::vector<unsigned char> bytes(4 * sizeof(float) + 1);
  zmq::message_t odd(bytes.data() + 1, 4 * sizeof(float), nullptr, nullptr);
  CHECK_FALSE(r.keep(0, 4, odd));
  CHECK(odd.size() == 4 * sizeof(float));  // left to the caller
  // A payload of another size than the chunk's.
  auto short_one = message_of({1, 2});
  CHECK_FALSE(r.keep(0, 4, short_one));
  CHECK(r.kept() == 0);
  CHECK_THROWS_AS(r.buffer_for(3, 2), std::out_of_range);
  // A kept chunk copied later is read from the buffer.
  auto kept = message_of({1, 2, 3, 4});
  REQUIRE(r.keep(0, 4, kept));
  const std::vector<float> fresh{9, 8, 7, 6};
  std::memcpy(r.buffer_for(0, 4).data(), fresh.data(), sizeof(float) * 4);
  CHECK(r.kept() == 0);
  CHECK(joined(r) == fresh);
}
