// The wire protocol's header codec: exact round trips, and a decoder that
// turns every malformed frame into ProtocolError without over-allocating.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "shared/messages.h"
#include "shared/protocol.h"

using namespace pstrain::wire;

namespace {

Header full_header() {
  Header h;
  h.protocol = 0x01020304;
  h.op = Op::push_pull;
  h.request_id = 0x1122334455667788ULL;
  h.sender = 0xa1b2c3d4;
  h.incarnation = 0x0f1e2d3c4b5a6978ULL;
  h.run_id = 0xfedcba9876543210ULL;
  h.generation = 0x7a6b5c4d3e2f1001ULL;
  h.name = "dense0/w";
  h.chunk = 77;
  h.version = 0x0102030405060708ULL;
  h.operand = 0x8877665544332211ULL;
  h.dtype = DType::bytes;
  h.elements = 12345;
  h.payload_frames = 2;
  h.status = Status::error;
  h.text = std::string("text with \0 inside", 18);
  h.priority = 0x5a5b5c5d;
  return h;
}

void check_equal(const Header& a, const Header& b) {
  CHECK(a.protocol == b.protocol);
  CHECK(a.op == b.op);
  CHECK(a.request_id == b.request_id);
  CHECK(a.sender == b.sender);
  CHECK(a.incarnation == b.incarnation);
  CHECK(a.run_id == b.run_id);
  CHECK(a.generation == b.generation);
  CHECK(a.name == b.name);
  CHECK(a.chunk == b.chunk);
  CHECK(a.version == b.version);
  CHECK(a.operand == b.operand);
  CHECK(a.dtype == b.dtype);
  CHECK(a.elements == b.elements);
  CHECK(a.payload_frames == b.payload_frames);
  CHECK(a.status == b.status);
  CHECK(a.text == b.text);
  CHECK(a.priority == b.priority);
}

Header decode(const std::vector<std::uint8_t>& bytes) { return decode_header(bytes); }

// Offsets of the fields in an encoded header with empty strings: u32
// protocol, u8 op, u64 request id, u32 sender, u64 incarnation, u64 run id,
// u64 generation, u32 name length.
constexpr std::size_t kOpOffset = 4;
constexpr std::size_t kNameLengthOffset = 4 + 1 + 8 + 4 + 8 + 8 + 8;

void put_u32(std::vector<std::uint8_t>& b, std::size_t at, std::uint32_t v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

}  // namespace

TEST_CASE("protocol: every header field survives a round trip") {
  const Header h = full_header();
  check_equal(decode(encode_header(h)), h);
  check_equal(decode(encode_header(Header{})), Header{});
}

TEST_CASE("protocol: every op round-trips and has a name") {
  for (std::uint8_t op = 1; op <= kMaxOp; ++op) {
    Header h;
    h.op = static_cast<Op>(op);
    CHECK(decode(encode_header(h)).op == h.op);
    CHECK(to_string(h.op) != "unknown");
  }
}

TEST_CASE("protocol: strings at their limits are accepted, beyond them refused") {
  Header h;
  h.name.assign(kMaxNameBytes, 'v');
  h.text.assign(kMaxTextBytes, 't');
  check_equal(decode(encode_header(h)), h);
  h.name.push_back('v');
  CHECK_THROWS_WITH_AS(encode_header(h), doctest::Contains("name"), ProtocolError);
  h.name.pop_back();
  h.text.push_back('t');
  CHECK_THROWS_WITH_AS(encode_header(h), doctest::Contains("text"), ProtocolError);
}

TEST_CASE("protocol: every truncation of a valid header is a ProtocolError") {
  const auto bytes = encode_header(full_header());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + n);
    CHECK_THROWS_AS(decode(cut), ProtocolError);
  }
}

TEST_CASE("protocol: trailing bytes and oversized frames are refused") {
  auto bytes = encode_header(Header{});
  bytes.push_back(0);
  CHECK_THROWS_WITH_AS(decode(bytes), doctest::Contains("trailing"), ProtocolError);
  std::vector<std::uint8_t> huge(kMaxHeaderBytes + 1, 0);
  CHECK_THROWS_WITH_AS(decode(huge), doctest::Contains("limit"), ProtocolError);
}

TEST_CASE("protocol: string lengths are checked against limits and remaining bytes") {
  auto bytes = encode_header(Header{});
  SUBCASE("name longer than the limit") {
    put_u32(bytes, kNameLengthOffset, kMaxNameBytes + 1);
    CHECK_THROWS_WITH_AS(decode(bytes), doctest::Contains("name declares"), ProtocolError);
  }
  SUBCASE("name longer than the frame") {
    put_u32(bytes, kNameLengthOffset, 1000);
    CHECK_THROWS_WITH_AS(decode(bytes), doctest::Contains("remain"), ProtocolError);
  }
  SUBCASE("text length of 4 GiB") {
    // An empty text's u32 length, then the u32 priority, end the frame.
    put_u32(bytes, bytes.size() - 8, 0xffffffffu);
    CHECK_THROWS_WITH_AS(decode(bytes), doctest::Contains("text declares"), ProtocolError);
  }
}

TEST_CASE("protocol: enums, frame counts and payload sizes are range-checked") {
  SUBCASE("op 0 and op past the last") {
    for (std::uint8_t bad : {std::uint8_t{0}, std::uint8_t(kMaxOp + 1), std::uint8_t{255}}) {
      auto bytes = encode_header(Header{});
      bytes[kOpOffset] = bad;
      CHECK_THROWS_WITH_AS(decode(bytes), doctest::Contains("unknown op"), ProtocolError);
    }
  }
  SUBCASE("dtype") {
    Header h;
    h.dtype = static_cast<DType>(7);
    CHECK_THROWS_WITH_AS(decode(encode_header(h)), doctest::Contains("dtype"), ProtocolError);
  }
  SUBCASE("status") {
    Header h;
    h.status = static_cast<Status>(2);
    CHECK_THROWS_WITH_AS(decode(encode_header(h)), doctest::Contains("status"), ProtocolError);
  }
  SUBCASE("payload frames") {
    Header h;
    h.payload_frames = kMaxPayloadFrames + 1;
    CHECK_THROWS_WITH_AS(decode(encode_header(h)), doctest::Contains("payload_frames"),
                         ProtocolError);
  }
  SUBCASE("payload larger than the limit, including overflowing counts") {
    Header h;
    h.payload_frames = 1;
    h.elements = kMaxPayloadBytes / 4;
    CHECK_NOTHROW(decode(encode_header(h)));
    h.elements += 1;
    CHECK_THROWS_AS(decode(encode_header(h)), ProtocolError);
    h.elements = ~0ULL / 2 + 1;  // elements * 4 wraps around to 0
    CHECK_THROWS_AS(decode(encode_header(h)), ProtocolError);
  }
  SUBCASE("elements without payload frames") {
    Header h;
    h.elements = 1;
    CHECK_THROWS_WITH_AS(decode(encode_header(h)), doctest::Contains("no payload frames"),
                         ProtocolError);
  }
  SUBCASE("an op's number is not a payload size") {
    Header h;
    h.op = Op::heartbeat;
    h.operand = ~0ULL;
    CHECK(decode(encode_header(h)).operand == ~0ULL);
  }
}

TEST_CASE("protocol: check_payload compares frame size with count * element size") {
  Header h;
  h.payload_frames = 1;
  h.elements = 10;
  CHECK_NOTHROW(check_payload(h, 0, 40));
  CHECK_THROWS_WITH_AS(check_payload(h, 0, 39), doctest::Contains("39 bytes"), ProtocolError);
  CHECK_THROWS_AS(check_payload(h, 1, 40), ProtocolError);
  h.dtype = DType::bytes;
  CHECK_NOTHROW(check_payload(h, 0, 10));
  CHECK_THROWS_AS(check_payload(h, 0, 40), ProtocolError);
}

TEST_CASE("protocol: bf16 and fp16 frames hold 2 bytes per value; others are refused") {
  for (const DType type : {DType::bf16, DType::fp16}) {
    CAPTURE(to_string(type));
    Header h;
    h.op = Op::push;
    h.dtype = type;
    h.payload_frames = 1;
    h.elements = 10;
    CHECK(element_bytes(type) == 2);
    CHECK(decode(encode_header(h)).dtype == type);
    CHECK_NOTHROW(check_payload(h, 0, 20));
    // An f32 frame under a 16-bit header: the mismatch is named.
    CHECK_THROWS_WITH_AS(check_payload(h, 0, 40),
                         doctest::Contains("40 bytes, but the header declares 10 elements (20"),
                         ProtocolError);
    CHECK(is_float(type));
    CHECK(dtype_of(*half_format(type)) == type);
  }
  CHECK_FALSE(half_format(DType::f32).has_value());
  CHECK_FALSE(is_float(DType::bytes));
  Header h;
  CHECK(is_compressed(DType::topk));
  CHECK(is_compressed(DType::sign));
  CHECK_FALSE(is_compressed(DType::f32));
  CHECK_FALSE(is_float(DType::topk));
  h.dtype = static_cast<DType>(6);
  CHECK_THROWS_WITH_AS(decode(encode_header(h)), doctest::Contains("unknown dtype 6"),
                       ProtocolError);
  // The largest 16-bit payload is twice as many values as the largest f32 one.
  h.dtype = DType::bf16;
  h.payload_frames = 1;
  h.elements = kMaxPayloadBytes / 2;
  CHECK_NOTHROW(decode(encode_header(h)));
  h.elements += 1;
  CHECK_THROWS_AS(decode(encode_header(h)), ProtocolError);
}

TEST_CASE("protocol: widen reads 16-bit frames at any alignment, as low_precision.h decodes") {
  const std::vector<float> values{1.0f, -2.5f, 3.14159f, 1e-6f, 65504.0f, 70000.0f, -0.0f};
  for (const auto format : {pstrain::HalfFormat::bf16, pstrain::HalfFormat::fp16}) {
    std::vector<std::uint16_t> bits(values.size());
    pstrain::encode_halves(format, values.data(), bits.data(), bits.size());
    // At offset 1 the frame's values sit at odd addresses.
    for (const std::size_t at : {std::size_t{0}, std::size_t{1}}) {
      std::vector<std::uint8_t> frame(at + bits.size() * 2);
      std::memcpy(frame.data() + at, bits.data(), bits.size() * 2);
      std::vector<float> out(values.size());
      widen(format, {frame.data() + at, bits.size() * 2}, out.data());
      for (std::size_t i = 0; i < values.size(); ++i) {
        const float want = pstrain::round_to_half(format, values[i]);
        CHECK(std::memcmp(&out[i], &want, sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("protocol: random and mutated bytes never crash the decoder") {
  std::mt19937_64 rng(12345);
  const auto valid = encode_header(full_header());
  std::size_t accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    std::vector<std::uint8_t> bytes;
    if (i % 2 == 0) {
      bytes.resize(rng() % 200);
      for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    } else {
      bytes = valid;
      for (int flips = 1 + static_cast<int>(rng() % 4); flips > 0; --flips)
        bytes[rng() % bytes.size()] = static_cast<std::uint8_t>(rng());
    }
    try {
      const Header h = decode(bytes);
      // Whatever is accepted must be within every documented limit.
      CHECK(h.name.size() <= kMaxNameBytes);
      CHECK(h.text.size() <= kMaxTextBytes);
      CHECK(h.payload_frames <= kMaxPayloadFrames);
      ++accepted;
    } catch (const ProtocolError&) {
    }
  }
  // Mutations of the integer fields leave valid headers, so some must pass.
  CHECK(accepted > 0);
}

TEST_CASE("protocol: replies copy the request's identity") {
  const Header req = full_header();
  const Header ok = reply_to(req);
  CHECK(ok.op == req.op);
  CHECK(ok.request_id == req.request_id);
  CHECK(ok.name == req.name);
  CHECK(ok.chunk == req.chunk);
  CHECK(ok.status == Status::ok);
  CHECK(ok.protocol == kProtocolVersion);
  const Header err = error_reply(req, "no such chunk");
  CHECK(err.status == Status::error);
  CHECK(err.text == "no such chunk");
  CHECK(err.request_id == req.request_id);
  CHECK(error_reply(req, std::string(kMaxTextBytes + 10, 'x')).text.size() == kMaxTextBytes);
}

namespace {

// A view written into a header, sent through the codec and read back.
template <class View>
View through_wire(const View& view) {
  Header h;
  view.write(h);
  return View::read(decode(encode_header(h)));
}

}  // namespace

TEST_CASE("messages: every op's typed view survives the wire") {
  CHECK(through_wire(ChunkRequest{"dense0/w", 9}).variable == "dense0/w");
  CHECK(through_wire(ChunkRequest{"dense0/w", 9}).chunk == 9);
  CHECK(through_wire(ChunkReply{41}).version == 41);
  CHECK(through_wire(Hello{"job: x\n"}).config_yaml == "job: x\n");
  CHECK(through_wire(HelloReply{3}).workers == 3);
  CHECK(through_wire(Barrier{"start", 4}).name == "start");
  CHECK(through_wire(Barrier{"start", 4}).count == 4);
  CHECK(through_wire(BarrierReply{4}).released == 4);
  CHECK(through_wire(KvSet{"gloo/0"}).key == "gloo/0");
  CHECK(through_wire(KvGet{"gloo/0", 2500}).key == "gloo/0");
  CHECK(through_wire(KvGet{"gloo/0", 2500}).timeout_ms == 2500);
  CHECK(through_wire(Progress{~0ULL}).samples == ~0ULL);
  CHECK(through_wire(Done{1234}).total_samples == 1234);
  CHECK(through_wire(GlobalSamples{99}).global_samples == 99);
  CHECK(through_wire(SnapshotReply{"run/snapshot/ps0.bin"}).path == "run/snapshot/ps0.bin");
  CHECK(through_wire(StatsReply{"{}"}).json == "{}");
}

TEST_CASE("messages: a kv_get's timeout is a number in the header, not text") {
  Header h;
  KvGet{"k", 300}.write(h);
  CHECK(h.operand == 300);
  CHECK(h.text.empty());
}
