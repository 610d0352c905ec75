// The ps's coordinator without ZeroMQ: requests made up in the test, replies
// caught by a recording sink, and time given explicitly.
#include <doctest/doctest.h>

#include "server/coordinator.h"
#include "shared/messages.h"
#include "tests/support/recording_sink.h"

using namespace pstrain;
using namespace pstrain::ps;
using namespace std::chrono_literals;
using wire::Op;

namespace {

const Clock::time_point t0{};

// A request of `op` from sender `sender` (peer "w<sender>") at `at`.
Request request(Op op, std::uint32_t sender, Clock::time_point at) {
  Request r;
  r.from = "w" + std::to_string(sender);
  r.header.op = op;
  r.header.sender = sender;
  r.header.request_id = 100 + sender;
  r.received = at;
  return r;
}

// The same, its header filled by the op's view.
template <class View>
Request request(Op op, std::uint32_t sender, Clock::time_point at, const View& view) {
  Request r = request(op, sender, at);
  view.write(r.header);
  return r;
}

Request kv_set(std::uint32_t sender, Clock::time_point at, const std::string& key,
               const std::vector<std::uint8_t>& value) {
  Request r = request(Op::kv_set, sender, at, wire::KvSet{key});
  r.header.dtype = wire::DType::bytes;
  r.header.elements = value.size();
  r.header.payload_frames = 1;
  r.payload = value;
  return r;
}

// A coordinator serving from t0.
struct Fixture {
  explicit Fixture(std::uint32_t workers, std::chrono::duration<double> timeout = 60s,
                   WorkerLoss on_loss = WorkerLoss::fail)
      : coordinator({"ps 0", workers, timeout, on_loss}, sink) {
    coordinator.start(t0);
  }
  RecordingSink sink;
  Coordinator coordinator;
};

std::string error_text(const Sent& s) {
  CHECK(s.header.status == wire::Status::error);
  return wire::ErrorReply::read(s.header).text;
}

}  // namespace

TEST_CASE("coordinator: a barrier releases everyone once count distinct senders entered") {
  Fixture f(3);
  f.coordinator.barrier(request(Op::barrier, 0, t0, wire::Barrier{"start", 3}));
  f.coordinator.barrier(request(Op::barrier, 1, t0, wire::Barrier{"start", 3}));
  // The same sender again is not a third one.
  f.coordinator.barrier(request(Op::barrier, 1, t0, wire::Barrier{"start", 3}));
  CHECK(f.sink.sent.empty());
  CHECK(f.coordinator.figures().parked_barrier == 3);

  f.coordinator.barrier(request(Op::barrier, 2, t0, wire::Barrier{"start", 3}));
  REQUIRE(f.sink.sent.size() == 4);
  std::vector<Peer> to;
  for (const auto& s : f.sink.sent) {
    to.push_back(s.to);
    CHECK(s.header.status == wire::Status::ok);
    CHECK(s.header.op == Op::barrier);
    CHECK(wire::BarrierReply::read(s.header).released == 4);
  }
  CHECK(to == std::vector<Peer>{"w0", "w1", "w1", "w2"});
  CHECK(f.sink.sent[0].header.request_id == 100);
  CHECK(f.coordinator.figures().parked_barrier == 0);
}

TEST_CASE("coordinator: a barrier entered with another count is refused, the first waits on") {
  Fixture f(3);
  f.coordinator.barrier(request(Op::barrier, 0, t0, wire::Barrier{"b", 2}));
  CHECK_THROWS_WITH_AS(f.coordinator.barrier(request(Op::barrier, 1, t0, wire::Barrier{"b", 3})),
                       doctest::Contains("entered with count 2, this request says 3"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(f.coordinator.barrier(request(Op::barrier, 1, t0, wire::Barrier{"c", 0})),
                       doctest::Contains("at least 1"), std::invalid_argument);
  CHECK(f.sink.sent.empty());
  CHECK(f.coordinator.figures().parked_barrier == 1);
  // The refused senders did not count: the barrier still needs a second one.
  f.coordinator.barrier(request(Op::barrier, 2, t0, wire::Barrier{"b", 2}));
  CHECK(f.sink.sent.size() == 2);
}

TEST_CASE("coordinator: a kv_get is parked until the key is set") {
  Fixture f(2);
  f.coordinator.kv_get(request(Op::kv_get, 1, t0, wire::KvGet{"gloo/rank0", 10'000}));
  CHECK(f.sink.sent.empty());
  CHECK(f.coordinator.figures().parked_kv_get == 1);
  CHECK(f.coordinator.next_deadline() == t0 + 10s);
  f.coordinator.tick(t0 + 5s);
  CHECK(f.sink.sent.empty());

  const std::vector<std::uint8_t> value{1, 2, 3, 0, 255};
  f.coordinator.kv_set(kv_set(0, t0 + 5s, "gloo/rank0", value));
  REQUIRE(f.sink.sent.size() == 2);
  CHECK(f.sink.sent[0].to == "w0");  // the setter's reply
  CHECK(f.sink.sent[0].header.op == Op::kv_set);
  CHECK(f.sink.sent[1].to == "w1");  // the parked getter's value
  CHECK(f.sink.sent[1].header.op == Op::kv_get);
  CHECK(*std::get<SharedBytes>(f.sink.sent[1].payload) == value);
  CHECK(f.coordinator.figures().parked_kv_get == 0);
  CHECK_FALSE(f.coordinator.next_deadline().has_value());

  // Once set, a kv_get is answered at once, even with no time to wait.
  f.coordinator.kv_get(request(Op::kv_get, 1, t0 + 6s, wire::KvGet{"gloo/rank0", 0}));
  REQUIRE(f.sink.sent.size() == 3);
  CHECK(*std::get<SharedBytes>(f.sink.sent[2].payload) == value);
}

TEST_CASE("coordinator: a parked kv_get expires at its deadline, naming the key and the wait") {
  Fixture f(1);
  f.coordinator.kv_get(request(Op::kv_get, 0, t0, wire::KvGet{"missing", 300}));
  f.coordinator.tick(t0 + 299ms);
  CHECK(f.sink.sent.empty());
  f.coordinator.tick(t0 + 300ms);
  REQUIRE(f.sink.sent.size() == 1);
  CHECK(f.sink.sent[0].to == "w0");
  CHECK(error_text(f.sink.sent[0]) == "ps 0: kv_get 'missing': not set within 0.3 s");
  CHECK(f.coordinator.figures().parked_kv_get == 0);
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  CHECK_THROWS_WITH_AS(f.coordinator.kv_get(request(Op::kv_get, 0, t0, wire::KvGet{"k", ~0ULL})),
                       doctest::Contains("timeout"), std::invalid_argument);
}

TEST_CASE("coordinator: a silent worker ends the ps with 3, answering parked requests why") {
  Fixture f(3, 10s);
  f.coordinator.heard(0, t0);
  f.coordinator.heard(2, t0);
  f.coordinator.barrier(request(Op::barrier, 0, t0, wire::Barrier{"epoch", 3}));
  f.coordinator.kv_get(request(Op::kv_get, 2, t0, wire::KvGet{"k", 86'400'000}));
  f.coordinator.heard(0, t0 + 9s);  // worker 0 keeps talking; 1 never came, 2 stopped
  f.coordinator.tick(t0 + 9s);
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  CHECK(f.sink.sent.empty());

  f.coordinator.tick(t0 + 10s);
  CHECK(f.coordinator.exit_code() == 3);
  REQUIRE(f.sink.sent.size() == 2);
  const std::string reason = "ps 0: no message from worker(s) 1, 2 for 10.0 s (net.worker_timeout)";
  CHECK(f.sink.sent[0].to == "w0");
  CHECK(f.sink.sent[0].header.op == Op::barrier);
  CHECK(error_text(f.sink.sent[0]) == reason);
  CHECK(f.sink.sent[1].to == "w2");
  CHECK(f.sink.sent[1].header.op == Op::kv_get);
  CHECK(error_text(f.sink.sent[1]) == reason);
  CHECK(f.coordinator.figures().parked_barrier == 0);
  CHECK(f.coordinator.figures().parked_kv_get == 0);
}

TEST_CASE("coordinator: no worker timeout before start(), nor for done workers") {
  RecordingSink sink;
  Coordinator coordinator({"ps 0", 2, 1s, WorkerLoss::fail}, sink);
  coordinator.heard(7, t0);   // a tool, not a worker
  coordinator.tick(t0 + 1h);  // not serving yet (a long restore, say)
  CHECK_FALSE(coordinator.exit_code().has_value());
  coordinator.start(t0 + 1h);
  coordinator.heard(0, t0 + 1h);
  coordinator.done(request(Op::done, 1, t0 + 1h, wire::Done{5}));
  coordinator.heard(0, t0 + 1h + 900ms);
  coordinator.tick(t0 + 1h + 1500ms);  // worker 1 is done, worker 0 was heard lately
  CHECK_FALSE(coordinator.exit_code().has_value());
}

TEST_CASE("coordinator: a ps no worker contacts exits 3 after worker_timeout from start") {
  for (const auto loss : {WorkerLoss::fail, WorkerLoss::continue_}) {
    CAPTURE(to_string(loss));
    Fixture f(2, 10s, loss);
    f.coordinator.heard(7, t0 + 5s);  // a tool is not a worker
    f.coordinator.kv_get(request(Op::kv_get, 7, t0, wire::KvGet{"k", 86'400'000}));
    f.coordinator.tick(t0 + 9s);
    CHECK_FALSE(f.coordinator.exit_code().has_value());
    f.coordinator.tick(t0 + 10s);
    CHECK(f.coordinator.exit_code() == 3);
    REQUIRE(f.sink.sent.size() == 1);  // the parked kv_get learns why
    CHECK(error_text(f.sink.sent[0]).find("worker(s) 0, 1") != std::string::npos);
  }
}

TEST_CASE("coordinator: continue: a silent worker is absent, the others go on and finish") {
  Fixture f(3, 10s, WorkerLoss::continue_);
  for (std::uint32_t w = 0; w < 3; ++w) f.coordinator.heard(w, t0);
  f.coordinator.barrier(request(Op::barrier, 0, t0 + 5s, wire::Barrier{"train-done", 3}));
  f.coordinator.heard(0, t0 + 9s);
  f.coordinator.heard(1, t0 + 9s);
  f.coordinator.tick(t0 + 9s);
  CHECK(f.sink.sent.empty());
  // Worker 2 stopped at t0: absent at t0 + 10 s. The barrier still waits for
  // worker 1, which is live.
  f.coordinator.tick(t0 + 10s);
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  CHECK(f.sink.sent.empty());
  f.coordinator.barrier(request(Op::barrier, 1, t0 + 11s, wire::Barrier{"train-done", 3}));
  REQUIRE(f.sink.sent.size() == 2);  // every live worker entered
  for (const auto& s : f.sink.sent) {
    CHECK(s.header.status == wire::Status::ok);
    CHECK(wire::BarrierReply::read(s.header).released == 2);
  }
  CHECK(f.coordinator.figures().parked_barrier == 0);

  f.coordinator.done(request(Op::done, 0, t0 + 12s, wire::Done{64}));
  CHECK_FALSE(f.coordinator.exit_code().has_value());  // worker 1 is live
  f.coordinator.done(request(Op::done, 1, t0 + 12s, wire::Done{64}));
  CHECK(f.coordinator.exit_code() == 0);
}

TEST_CASE("coordinator: continue: a barrier waiting only for a lost worker releases then") {
  Fixture f(2, 10s, WorkerLoss::continue_);
  f.coordinator.heard(0, t0);  // worker 1 never comes
  f.coordinator.barrier(request(Op::barrier, 0, t0, wire::Barrier{"train-done", 2}));
  f.coordinator.heard(0, t0 + 9s);
  f.coordinator.tick(t0 + 9s);
  CHECK(f.sink.sent.empty());
  f.coordinator.tick(t0 + 10s);
  REQUIRE(f.sink.sent.size() == 1);
  CHECK(f.sink.sent[0].to == "w0");
  CHECK(f.sink.sent[0].header.status == wire::Status::ok);
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  // A barrier only tools entered still needs its count.
  f.coordinator.barrier(request(Op::barrier, 7, t0 + 10s, wire::Barrier{"tools", 2}));
  CHECK(f.sink.sent.size() == 1);
}

TEST_CASE("coordinator: continue: a worker heard again is live again, late or restarted") {
  Fixture f(2, 10s, WorkerLoss::continue_);
  f.coordinator.heard(0, t0 + 1s);
  f.coordinator.heard(0, t0 + 15s);
  f.coordinator.tick(t0 + 15s);  // worker 1, never heard, is absent
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  // It starts late (more than worker_timeout after worker 0): live, and a
  // barrier waits for it again.
  f.coordinator.heard(1, t0 + 16s);
  f.coordinator.barrier(request(Op::barrier, 0, t0 + 16s, wire::Barrier{"train-done", 2}));
  f.coordinator.heard(0, t0 + 25s);
  f.coordinator.heard(1, t0 + 25s);
  f.coordinator.tick(t0 + 25s);
  CHECK(f.sink.sent.empty());
  f.coordinator.done(request(Op::done, 1, t0 + 25s, wire::Done{64}));
  // Worker 1 finished without the barrier (it cannot enter any more).
  REQUIRE(f.sink.sent.size() == 2);
  CHECK(f.sink.sent[0].to == "w1");  // the reply to done
  CHECK(f.sink.sent[1].to == "w0");  // the barrier, released
  CHECK_FALSE(f.coordinator.exit_code().has_value());
}

TEST_CASE("coordinator: continue: every worker lost exits 3, answering parked requests") {
  Fixture f(2, 10s, WorkerLoss::continue_);
  f.coordinator.heard(0, t0);
  f.coordinator.heard(1, t0 + 5s);
  f.coordinator.kv_get(request(Op::kv_get, 1, t0 + 5s, wire::KvGet{"k", 86'400'000}));
  f.coordinator.tick(t0 + 10s);  // worker 0 absent; 1 is live
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  CHECK(f.sink.sent.empty());
  f.coordinator.tick(t0 + 15s);
  CHECK(f.coordinator.exit_code() == 3);
  REQUIRE(f.sink.sent.size() == 1);
  CHECK(error_text(f.sink.sent[0]) == "ps 0: every worker is lost: worker(s) 0, 1 absent");
}

TEST_CASE("coordinator: done of every worker exits 0; progress reports count global samples") {
  Fixture f(2);
  f.coordinator.progress(request(Op::progress, 0, t0, wire::Progress{64}));
  f.coordinator.progress(request(Op::progress, 1, t0, wire::Progress{32}));
  CHECK(wire::GlobalSamples::read(f.sink.sent.back().header).global_samples == 96);
  CHECK_THROWS_WITH_AS(f.coordinator.progress(request(Op::progress, 2, t0, wire::Progress{1})),
                       doctest::Contains("not a worker"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(f.coordinator.progress(request(Op::progress, 0, t0, wire::Progress{~0ULL})),
                       doctest::Contains("overflows"), std::invalid_argument);

  f.coordinator.done(request(Op::done, 0, t0, wire::Done{64}));
  f.coordinator.done(request(Op::done, 0, t0, wire::Done{64}));  // twice is once
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  CHECK_THROWS_AS(f.coordinator.done(request(Op::done, 5, t0, wire::Done{1})),
                  std::invalid_argument);
  f.coordinator.done(request(Op::done, 1, t0, wire::Done{32}));
  CHECK(f.coordinator.exit_code() == 0);
  // Every done was answered, with the global count.
  CHECK(f.sink.sent.back().to == "w1");
  CHECK(wire::GlobalSamples::read(f.sink.sent.back().header).global_samples == 96);
}

TEST_CASE("coordinator: shutdown exits 0 after replying; hello tells the number of workers") {
  Fixture f(4);
  f.coordinator.hello(request(Op::hello, 9, t0, wire::Hello{}));
  CHECK(wire::HelloReply::read(f.sink.sent.back().header).workers == 4);
  CHECK_FALSE(f.coordinator.exit_code().has_value());
  f.coordinator.shutdown(request(Op::shutdown, 9, t0));
  CHECK(f.sink.sent.back().header.op == Op::shutdown);
  CHECK(f.coordinator.exit_code() == 0);
}

TEST_CASE("coordinator: a restored ps counts the acknowledged updates its restore lost") {
  // Worker 1's process (incarnation 77) says hello and has 5 chunk updates
  // applied; a checkpoint is cut after those 5.
  Fixture before(2);
  auto hello = [](std::uint64_t incarnation, std::uint64_t acked) {
    Request r = request(Op::hello, 1, t0, wire::Hello{"", acked});
    r.header.incarnation = incarnation;
    return r;
  };
  before.coordinator.hello(hello(77, 0));
  Request push = request(Op::push, 1, t0);
  push.header.incarnation = 77;
  for (int i = 0; i < 5; ++i) before.coordinator.applied_update(push.header);
  before.coordinator.progress(request(Op::progress, 1, t0, wire::Progress{640}));
  SnapshotInfo checkpoint;
  before.coordinator.fill_progress(checkpoint);
  CHECK(checkpoint.worker_updates == std::vector<std::uint64_t>{0, 5});
  CHECK(checkpoint.worker_incarnations == std::vector<std::uint64_t>{0, 77});

  // The ps restarts from it; two more updates arrive (resends) before the
  // worker, which had 9 acknowledged, says hello again: 9 - (5 + 2) were lost.
  checkpoint.kind = SnapshotKind::checkpoint;
  // An end-of-run snapshot of the same state seeds a new run: its workers
  // start afresh.
  Fixture seeded(2);
  SnapshotInfo snapshot = checkpoint;
  snapshot.kind = SnapshotKind::snapshot;
  seeded.coordinator.restore_progress(snapshot, 5);
  seeded.coordinator.progress(request(Op::progress, 1, t0, wire::Progress{0}));
  const auto seeded_reply = wire::GlobalSamples::read(seeded.sink.sent.back().header);
  CHECK(seeded_reply.global_samples == 640);
  CHECK(seeded_reply.sender_samples == 0);

  Fixture after(2);
  after.coordinator.restore_progress(checkpoint, 5);
  after.coordinator.applied_update(push.header);
  after.coordinator.applied_update(push.header);
  after.coordinator.hello(hello(77, 9));
  CHECK(after.coordinator.figures().updates_lost == std::vector<std::uint64_t>{0, 2});
  const auto reply = wire::HelloReply::read(after.sink.sent.back().header);
  CHECK(reply.state_updates == 7);
  // The restarted worker resumes from the samples ps 0 counted of it.
  after.coordinator.progress(request(Op::progress, 1, t0, wire::Progress{0}));
  CHECK(wire::GlobalSamples::read(after.sink.sent.back().header).sender_samples == 640);

  // A hello in step with the ps loses nothing; a new process of the worker
  // starts its own count.
  after.coordinator.hello(hello(77, 9));
  after.coordinator.hello(hello(78, 0));
  after.coordinator.applied_update(push.header);  // incarnation 77's: no longer counted
  CHECK(after.coordinator.figures().updates_lost == std::vector<std::uint64_t>{0, 2});
  SnapshotInfo later;
  after.coordinator.fill_progress(later);
  CHECK(later.worker_updates == std::vector<std::uint64_t>{0, 0});
  CHECK(later.worker_incarnations == std::vector<std::uint64_t>{0, 78});
}

TEST_CASE("coordinator: the key-value store refuses keys and bytes beyond its limits") {
  Fixture f(1);
  // Keys up to the limit; one more is refused and not stored.
  for (std::size_t k = 0; k < Coordinator::kMaxKvKeys; ++k)
    f.coordinator.kv_set(kv_set(0, t0, "k" + std::to_string(k), {1}));
  CHECK_THROWS_WITH_AS(f.coordinator.kv_set(kv_set(0, t0, "one more", {1})),
                       doctest::Contains("limit"), std::invalid_argument);
  f.coordinator.kv_get(request(Op::kv_get, 0, t0, wire::KvGet{"one more", 0}));
  f.coordinator.tick(t0 + 1ms);
  CHECK(f.sink.sent.back().header.status == wire::Status::error);
  // An existing key may still change.
  f.coordinator.kv_set(kv_set(0, t0, "k0", {2, 3}));

  // Bytes: 16 MiB values (the frame limit) fill the 64 MiB budget, counted
  // net of the values they replace.
  Fixture g(1);
  const std::vector<std::uint8_t> big(16 << 20, 7);
  for (int k = 0; k < 4; ++k) g.coordinator.kv_set(kv_set(0, t0, "big" + std::to_string(k), big));
  CHECK_THROWS_WITH_AS(g.coordinator.kv_set(kv_set(0, t0, "big4", {1})), doctest::Contains("bytes"),
                       std::invalid_argument);
  g.coordinator.kv_set(kv_set(0, t0, "big0", big));  // replaces as many bytes
  g.coordinator.kv_set(kv_set(0, t0, "big1", {}));   // frees 16 MiB ...
  g.coordinator.kv_set(kv_set(0, t0, "big4", big));  // ... which fit again
}

TEST_CASE("coordinator: a kv_set answers only the kv_gets of its key, in arrival order") {
  Fixture f(4);
  f.coordinator.kv_get(request(Op::kv_get, 1, t0, wire::KvGet{"a", 10'000}));
  f.coordinator.kv_get(request(Op::kv_get, 2, t0, wire::KvGet{"b", 10'000}));
  f.coordinator.kv_get(request(Op::kv_get, 3, t0, wire::KvGet{"a", 10'000}));
  f.coordinator.kv_set(kv_set(0, t0 + 1s, "a", {7}));
  REQUIRE(f.sink.sent.size() == 3);
  CHECK(f.sink.sent[0].header.op == Op::kv_set);
  CHECK(f.sink.sent[1].to == "w1");
  CHECK(f.sink.sent[2].to == "w3");
  // Both replies share the one stored value.
  CHECK(std::get<SharedBytes>(f.sink.sent[1].payload) ==
        std::get<SharedBytes>(f.sink.sent[2].payload));
  CHECK(f.coordinator.figures().parked_kv_get == 1);
  f.coordinator.kv_set(kv_set(0, t0 + 1s, "b", {8}));
  REQUIRE(f.sink.sent.size() == 5);
  CHECK(f.sink.sent[4].to == "w2");
  CHECK(*std::get<SharedBytes>(f.sink.sent[4].payload) == std::vector<std::uint8_t>{8});
  CHECK(f.coordinator.figures().parked_kv_get == 0);
  CHECK_FALSE(f.coordinator.next_deadline().has_value());
}

TEST_CASE("coordinator: parked kv_gets expire in deadline order, each at its own") {
  Fixture f(3);
  f.coordinator.kv_get(request(Op::kv_get, 0, t0, wire::KvGet{"k0", 300}));
  f.coordinator.kv_get(request(Op::kv_get, 1, t0, wire::KvGet{"k1", 100}));
  f.coordinator.kv_get(request(Op::kv_get, 2, t0 + 50ms, wire::KvGet{"k2", 100}));
  CHECK(f.coordinator.next_deadline() == t0 + 100ms);
  f.coordinator.tick(t0 + 120ms);
  REQUIRE(f.sink.sent.size() == 1);
  CHECK(f.sink.sent[0].to == "w1");
  CHECK(f.coordinator.next_deadline() == t0 + 150ms);
  f.coordinator.tick(t0 + 1s);
  REQUIRE(f.sink.sent.size() == 3);
  CHECK(f.sink.sent[1].to == "w2");
  CHECK(f.sink.sent[2].to == "w0");
  CHECK(error_text(f.sink.sent[2]) == "ps 0: kv_get 'k0': not set within 0.3 s");
  CHECK_FALSE(f.coordinator.next_deadline().has_value());
}

TEST_CASE("coordinator: parked requests are capped per peer and in all, barriers in number") {
  Fixture f(2);
  auto from = [](Request r, const std::string& peer) {
    r.from = peer;
    return r;
  };
  const auto get = [&](const std::string& peer, const std::string& key) {
    return from(request(Op::kv_get, 9, t0, wire::KvGet{key, 86'400'000}), peer);
  };
  for (std::size_t i = 0; i < Coordinator::kMaxParkedPerPeer; ++i)
    f.coordinator.kv_get(get("p0", "k" + std::to_string(i % 2)));
  CHECK_THROWS_WITH_AS(f.coordinator.kv_get(get("p0", "k0")),
                       doctest::Contains("64 requests of this connection are parked (barriers and "
                                         "kv_gets), the limit per peer"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      f.coordinator.barrier(from(request(Op::barrier, 9, t0, wire::Barrier{"b", 5}), "p0")),
      doctest::Contains("the limit per peer"), std::invalid_argument);
  CHECK(f.coordinator.figures().parked_kv_get == Coordinator::kMaxParkedPerPeer);
  CHECK(f.coordinator.figures().parked_barrier == 0);
  // Answered ones make room again.
  f.coordinator.kv_set(kv_set(0, t0, "k0", {1}));
  CHECK(f.coordinator.figures().parked_kv_get == Coordinator::kMaxParkedPerPeer / 2);
  f.coordinator.kv_get(get("p0", "k2"));

  // Other peers park until the ps's limit.
  const auto parked = f.coordinator.figures().parked_kv_get;
  for (std::size_t i = parked; i < Coordinator::kMaxParked; ++i)
    f.coordinator.kv_get(get("q" + std::to_string(i / Coordinator::kMaxParkedPerPeer), "x"));
  CHECK(f.coordinator.figures().parked_kv_get == Coordinator::kMaxParked);
  CHECK_THROWS_WITH_AS(f.coordinator.kv_get(get("fresh", "x")),
                       doctest::Contains("4096 requests are parked on this ps"),
                       std::invalid_argument);

  // Barriers open at once.
  Fixture g(2);
  for (std::size_t i = 0; i < Coordinator::kMaxBarriers; ++i)
    g.coordinator.barrier(
        from(request(Op::barrier, 9, t0, wire::Barrier{"b" + std::to_string(i), 5}),
             "r" + std::to_string(i)));
  CHECK_THROWS_WITH_AS(
      g.coordinator.barrier(from(request(Op::barrier, 9, t0, wire::Barrier{"one more", 5}), "s")),
      doctest::Contains("256 barriers are open, the limit; 'one more' is not opened"),
      std::invalid_argument);
  // An open one can still be entered.
  g.coordinator.barrier(from(request(Op::barrier, 9, t0, wire::Barrier{"b0", 5}), "s"));
  CHECK(g.coordinator.figures().parked_barrier == Coordinator::kMaxBarriers + 1);
}

TEST_CASE(
    "coordinator: one process per worker index; a restart takes over once the old one is silent") {
  Fixture f(2);  // takeover_silence: 3 s
  auto from = [](std::uint32_t sender, std::uint64_t incarnation, Clock::time_point at) {
    Request r = request(Op::heartbeat, sender, at);
    r.header.incarnation = incarnation;
    return r;
  };
  CHECK(f.coordinator.admit(from(0, 11, t0)));  // the first process holds index 0
  CHECK(f.coordinator.admit(from(0, 11, t0 + 1s)));
  CHECK(f.sink.sent.empty());

  // A second process with index 0 while the first is live: refused, with
  // when to ask again (the holder was heard 1 s ago; 2 s to go).
  CHECK_FALSE(f.coordinator.admit(from(0, 22, t0 + 2s)));
  REQUIRE(f.sink.sent.size() == 1);
  CHECK(f.sink.sent[0].to == "w0");
  CHECK(error_text(f.sink.sent[0]) ==
        "ps 0: worker index 0 is taken by a live process (incarnation 0x000000000000000b, heard "
        "1.0 s ago); a restart is accepted once the old process has been silent for 3.0 s (three "
        "liveness heartbeat intervals)");
  CHECK(wire::ErrorReply::read(f.sink.sent[0].header).retry_after_ms == 2000);

  // The refusal did not count as hearing from worker 0: 3.5 s after the
  // holder's last message the newcomer takes the index over (a restart).
  CHECK(f.coordinator.admit(from(0, 22, t0 + 4500ms)));
  // The old process, if it was only stopped, cannot act for the index again.
  CHECK_FALSE(f.coordinator.admit(from(0, 11, t0 + 10s)));
  REQUIRE(f.sink.sent.size() == 2);
  CHECK(error_text(f.sink.sent[1]) ==
        "ps 0: worker index 0: this process (incarnation 0x000000000000000b) was replaced by a "
        "newer one (incarnation 0x0000000000000016); its requests are refused");
  CHECK(wire::ErrorReply::read(f.sink.sent[1].header).retry_after_ms == 0);
  CHECK(f.coordinator.admit(from(0, 22, t0 + 10s)));

  // Incarnation 0 (a tool speaking the protocol by hand) and non-workers
  // are not checked.
  CHECK(f.coordinator.admit(from(0, 0, t0 + 10s)));
  CHECK(f.coordinator.admit(from(7, 5, t0 + 10s)));
  CHECK(f.coordinator.admit(from(7, 6, t0 + 10s)));

  // A worker that said done leaves its index to the next process at once.
  CHECK(f.coordinator.admit(from(1, 33, t0 + 10s)));
  f.coordinator.done(request(Op::done, 1, t0 + 10s, wire::Done{64}));
  CHECK(f.coordinator.admit(from(1, 44, t0 + 10s)));
  CHECK(f.sink.sent.size() == 3);  // done's reply; no refusal
}
