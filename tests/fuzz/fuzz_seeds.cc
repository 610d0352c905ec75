// Writes the fuzzers' seed corpora: valid messages for every op, in the
// fuzz targets' input format (fuzz_input.h), built with the same encoder and
// views the clients use, so the seeds follow the protocol as it is today.
//
//   fuzz_seeds DIR   writes DIR/header/<name> and DIR/ps/<name>
//
// header: one request per op (payloads included) and the replies a ps sends.
// ps: each op on its own, and short exchanges that reach deeper states (an
// init before pulls and pushes, requests batched in one message, a barrier both workers enter, a
// kv_get parked until its kv_set, a resent push, a run's end).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shared/messages.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace pstrain;
using wire::Header;
using wire::Op;

// One request: its header and payload frames.
struct Message {
  Header header;
  std::vector<std::vector<std::uint8_t>> payloads;
  std::uint8_t advance_ms = 1;  // ps target: clock step before it
};

Message request(Op op, std::uint32_t sender = 0, std::uint64_t id = 1) {
  Message m;
  m.header.op = op;
  m.header.sender = sender;
  m.header.request_id = id;
  m.header.run_id = fuzz::kPsRunId;
  return m;
}

Message with_floats(Message m, std::vector<float> values) {
  m.header.dtype = wire::DType::f32;
  m.header.elements = values.size();
  m.header.payload_frames = 1;
  const auto* p = reinterpret_cast<const std::uint8_t*>(values.data());
  m.payloads.emplace_back(p, p + values.size() * sizeof(float));
  return m;
}

// Values rounded to bf16 or fp16 (net.wire_dtype), as a worker sends them.
Message with_halves(Message m, HalfFormat format, const std::vector<float>& values) {
  m.header.dtype = wire::dtype_of(format);
  m.header.elements = values.size();
  m.header.payload_frames = 1;
  std::vector<std::uint16_t> bits(values.size());
  encode_halves(format, values.data(), bits.data(), values.size());
  const auto* p = reinterpret_cast<const std::uint8_t*>(bits.data());
  m.payloads.emplace_back(p, p + bits.size() * sizeof(std::uint16_t));
  return m;
}

Message with_bytes(Message m, const std::string& bytes) {
  m.header.dtype = wire::DType::bytes;
  m.header.elements = bytes.size();
  m.header.payload_frames = 1;
  m.payloads.emplace_back(bytes.begin(), bytes.end());
  return m;
}

Message chunk_op(Op op, std::uint64_t id, std::vector<float> values = {}) {
  auto m = request(op, 0, id);
  m.header.incarnation = 7;  // recorded, so that resends are answered
  wire::ChunkRequest{"w", 0}.write(m.header);
  return values.empty() ? m : with_floats(std::move(m), std::move(values));
}

Message init() { return chunk_op(Op::init, 1, {0.5f, -1.f, 2.f, 0.f}); }

// Two requests in one message (shared/protocol.h): `first`, which has no
// payload, then `second` and its payload, as the frames after first's header.
Message batched(Message first, const Message& second) {
  first.payloads.push_back(wire::encode_header(second.header));
  first.payloads.insert(first.payloads.end(), second.payloads.begin(), second.payloads.end());
  return first;
}

// A sparse op on rows 1, 5 and 9 of the fuzz target's table (dim 2); with
// `grads`, their gradients as the second frame.
Message sparse_op(Op op, std::uint64_t id, std::vector<float> grads = {}) {
  auto m = request(op, 0, id);
  m.header.incarnation = 7;
  wire::SparseRequest{"emb", 2}.write(m.header);
  const std::vector<std::uint64_t> ids{1, 5, 9};
  m.header.elements = ids.size();
  m.header.payload_frames = grads.empty() ? 1 : 2;
  const auto* p = reinterpret_cast<const std::uint8_t*>(ids.data());
  m.payloads.emplace_back(p, p + ids.size() * sizeof(std::uint64_t));
  if (!grads.empty()) {
    const auto* g = reinterpret_cast<const std::uint8_t*>(grads.data());
    m.payloads.emplace_back(g, g + grads.size() * sizeof(float));
  }
  return m;
}

// A pull whose reply's values travel in 16 bits.
Message pull_as(HalfFormat format, std::uint64_t id) {
  auto m = chunk_op(Op::pull, id);
  m.header.dtype = wire::dtype_of(format);
  return m;
}

Message hello(std::uint32_t sender) {
  auto m = request(Op::hello, sender);
  wire::Hello{"", 0}.write(m.header);
  return m;
}

Message barrier(std::uint32_t sender) {
  auto m = request(Op::barrier, sender);
  wire::Barrier{"start", fuzz::kPsWorkers}.write(m.header);
  return m;
}

Message kv_set() {
  auto m = request(Op::kv_set, 1);
  wire::KvSet{"gloo/rank1"}.write(m.header);
  return with_bytes(std::move(m), "127.0.0.1:40000");
}

Message kv_get(std::uint64_t timeout_ms) {
  auto m = request(Op::kv_get, 0);
  wire::KvGet{"gloo/rank1", timeout_ms}.write(m.header);
  return m;
}

Message heartbeat(std::uint32_t sender) { return request(Op::heartbeat, sender); }

Message progress(std::uint32_t sender) {
  auto m = request(Op::progress, sender);
  wire::Progress{64}.write(m.header);
  return m;
}

Message done(std::uint32_t sender) {
  auto m = request(Op::done, sender);
  wire::Done{6400}.write(m.header);
  return m;
}

void write(const std::filesystem::path& file, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", file.c_str());
    std::exit(2);
  }
}

// header target: the header frame, then the payload frames.
std::vector<std::uint8_t> header_input(const Message& m) {
  std::vector<std::uint8_t> out;
  fuzz::append_frame(out, wire::encode_header(m.header));
  for (const auto& p : m.payloads) fuzz::append_frame(out, p);
  return out;
}

// ps target: each message's control byte, header frame and payload frames.
std::vector<std::uint8_t> ps_input(const std::vector<Message>& messages) {
  std::vector<std::uint8_t> out;
  for (const auto& m : messages) {
    out.push_back(static_cast<std::uint8_t>(m.advance_ms << 2 | (1 + m.payloads.size())));
    fuzz::append_frame(out, wire::encode_header(m.header));
    for (const auto& p : m.payloads) fuzz::append_frame(out, p);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir / "header");
  std::filesystem::create_directories(dir / "ps");

  const std::vector<float> gradient{0.1f, 0.2f, -0.3f, 0.f};
  auto wrong_run = hello(1);
  wrong_run.header.run_id = 1;
  wire::Hello{"ps:\n  - host: 127.0.0.1\n    port: 1\n", 3}.write(wrong_run.header);
  auto late = kv_get(50);
  late.advance_ms = 63;
  // Each op alone.
  const std::vector<std::pair<std::string, Message>> ops{
      {"hello", hello(0)},
      {"hello_wrong_run", wrong_run},
      {"init", init()},
      {"pull", chunk_op(Op::pull, 2)},
      {"push", chunk_op(Op::push, 2, gradient)},
      {"push_pull", chunk_op(Op::push_pull, 2, gradient)},
      {"pull_bf16", pull_as(HalfFormat::bf16, 2)},
      {"push_bf16", with_halves(chunk_op(Op::push, 2), HalfFormat::bf16, gradient)},
      {"push_pull_fp16", with_halves(chunk_op(Op::push_pull, 2), HalfFormat::fp16, gradient)},
      {"assign", chunk_op(Op::assign, 2, {1.f, 2.f, 3.f, 4.f})},
      {"barrier", barrier(0)},
      {"snapshot", request(Op::snapshot, 100)},
      {"stats", request(Op::stats, 100)},
      {"shutdown", request(Op::shutdown, 100)},
      {"kv_set", kv_set()},
      {"kv_get", kv_get(0)},
      {"sparse_pull", sparse_op(Op::sparse_pull, 2)},
      {"sparse_push", sparse_op(Op::sparse_push, 2, {1.f, -1.f, 0.5f, 2.f, 0.f, 3.f})},
      {"heartbeat", heartbeat(0)},
      {"progress", progress(0)},
      {"done", done(0)},
  };
  for (const auto& [name, m] : ops) {
    write(dir / "header" / name, header_input(m));
    write(dir / "ps" / name, ps_input({m}));
  }
  // Replies, as a client decodes them.
  auto pulled = with_floats(chunk_op(Op::pull, 2), {1.f, 2.f});
  wire::ChunkReply{3}.write(pulled.header);
  write(dir / "header" / "reply_pull", header_input(pulled));
  write(dir / "header" / "reply_error",
        header_input({wire::error_reply(init().header, "ps 0: init of 'w' chunk 0: too big"), {}}));

  // Exchanges.
  const std::vector<std::pair<std::string, std::vector<Message>>> exchanges{
      {"chunk_ops",
       {hello(0), init(), chunk_op(Op::pull, 2), chunk_op(Op::push, 3, gradient),
        chunk_op(Op::push_pull, 4, gradient), chunk_op(Op::assign, 5, gradient),
        request(Op::stats, 100)}},
      {"batched",
       {init(), batched(chunk_op(Op::pull, 2), chunk_op(Op::push, 3, gradient)),
        batched(chunk_op(Op::pull, 4), chunk_op(Op::push_pull, 5, gradient))}},
      {"resent_push",
       {init(), chunk_op(Op::push, 2, gradient), chunk_op(Op::push, 2, gradient),
        chunk_op(Op::push_pull, 3, gradient), chunk_op(Op::push_pull, 3, gradient)}},
      {"wire_halves",
       {init(), pull_as(HalfFormat::bf16, 2),
        with_halves(chunk_op(Op::push, 3), HalfFormat::bf16, gradient),
        with_halves(chunk_op(Op::push_pull, 4), HalfFormat::fp16, gradient),
        with_halves(chunk_op(Op::init, 5), HalfFormat::bf16, gradient)}},
      {"barrier_released", {barrier(0), barrier(1)}},
      {"kv_parked", {kv_get(5000), kv_set(), kv_get(0)}},
      {"kv_expired", {kv_get(20), late}},
      {"snapshot_after_init", {init(), request(Op::snapshot, 100)}},
      {"resent_sparse_push_pull",
       {sparse_op(Op::sparse_push_pull, 3, {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}),
        sparse_op(Op::sparse_push_pull, 3, {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}),
        sparse_op(Op::sparse_pull, 4)}},
      {"run_end", {hello(0), hello(1), heartbeat(0), progress(1), done(0), done(1)}},
  };
  for (const auto& [name, messages] : exchanges) write(dir / "ps" / name, ps_input(messages));
  return 0;
}
