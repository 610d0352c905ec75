// The consistency modes between async and sync on the ps, without ZeroMQ:
// the SSP gate and the backup aggregator on their own, then the data
// handlers in each mode with made-up pushes of integer gradients (SGD with
// lr 1, so every expected value is exact), replies caught by a recording
// sink. Local SGD: two replicas against sync (tests/unit/test_sync.cc has
// the harness's twin for sync alone).
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "server/chunk_handlers.h"
#include "server/consistency/backup_aggregator.h"
#include "server/consistency/ssp_gate.h"
#include "server/coordinator.h"
#include "shared/messages.h"
#include "shared/metrics_registry.h"
#include "tests/support/recording_sink.h"

using namespace pstrain;
using namespace pstrain::ps;
using wire::Op;

namespace {

constexpr std::size_t kChunk = 4;

bool all(std::uint32_t) { return true; }

// A ps with one chunk "w" of kChunk values 100, 100, ... in `mode`, SGD with
// lr 1 (an update subtracts the gradient exactly), `workers` workers.
struct Ps {
  Ps(std::uint32_t workers, Consistency consistency, OptimizerConfig optimizer = sgd(false))
      : store(optimizer),
        coordinator({"ps 0", workers, std::chrono::seconds(60), WorkerLoss::continue_}, sink),
        stats(registry, 0),
        data(
            store, coordinator, sink, stats, std::filesystem::temp_directory_path() / "ps0.bin",
            [] { return ShardCut{}; }, consistency) {
    coordinator.start(Clock::time_point{});
    store.init("w", 0, std::vector<float>(kChunk, 100.0f));
  }
  static OptimizerConfig sgd(bool staleness_lr) {
    OptimizerConfig o;
    o.kind = OptimizerKind::sgd;
    o.lr = 1.0f;
    o.staleness_lr = staleness_lr;
    return o;
  }

  // A push_pull of `grad` (every element) from `worker` at step `clock`,
  // computed on version `base`; `id` is its request id.
  void push(std::uint32_t worker, std::uint64_t clock, float grad, std::uint64_t base = 0,
            std::uint64_t id = 0) {
    grads.emplace_back(kChunk, grad);
    Request r = chunk_request(Op::push_pull, worker, clock, base, id);
    r.header.elements = kChunk;
    r.header.payload_frames = 1;
    r.payload = {reinterpret_cast<const std::uint8_t*>(grads.back().data()),
                 kChunk * sizeof(float)};
    data.push(r);
  }
  void pull(std::uint32_t worker, std::uint64_t clock, std::uint64_t id = 0) {
    data.pull(chunk_request(Op::pull, worker, clock, 0, id));
  }
  Request chunk_request(Op op, std::uint32_t worker, std::uint64_t clock, std::uint64_t base,
                        std::uint64_t id) {
    Request r;
    r.from = "w" + std::to_string(worker);
    r.header.op = op;
    r.header.sender = worker;
    r.header.incarnation = 7;
    r.header.request_id = id ? id : ++next_id;
    wire::ChunkRequest{"w", 0, clock, base}.write(r.header);
    return r;
  }
  // The first value of every reply sent to `peer` so far, in order.
  std::vector<float> replies_to(const std::string& peer) const {
    std::vector<float> out;
    for (const auto& s : sink.sent) {
      if (s.to != peer) continue;
      const auto* values = std::get_if<ValueBuffer>(&s.payload);
      REQUIRE(values);
      out.push_back((**values)[0]);
    }
    return out;
  }
  float value() const { return (*store.find("w", 0)->values)[0]; }

  RecordingSink sink;
  ChunkStore store;
  Coordinator coordinator;
  MetricsRegistry registry;
  PsStats stats;
  ChunkHandlers data;
  std::vector<std::vector<float>> grads;  // alive while the handlers read them
  std::uint64_t next_id = 0;
};

Consistency ssp(std::uint32_t workers, std::uint64_t bound) {
  return {.mode = Mode::ssp, .workers = workers, .staleness_bound = bound};
}
Consistency backup(std::uint32_t workers, std::uint32_t b) {
  return {.mode = Mode::backup, .workers = workers, .backup_workers = b};
}

}  // namespace

TEST_CASE("ssp gate: a read at clock c waits for the slowest to complete c - s steps") {
  SspGate gate(3, 2);
  CHECK(gate.slowest(all) == 0);
  CHECK(gate.may_read(2, 0));  // c - s = 0
  CHECK_FALSE(gate.may_read(3, 0));
  gate.completed(0, 5);
  gate.completed(1, 3);
  gate.completed(2, 1);
  gate.completed(2, 0);  // clocks only go up
  CHECK(gate.slowest(all) == 1);
  CHECK(gate.slowest([](std::uint32_t w) { return w != 2; }) == 3);  // worker 2 lost
  CHECK(gate.slowest([](std::uint32_t) { return false; }) == UINT64_MAX);
  CHECK(SspGate::staleness(5, 1) == 4);
  CHECK(SspGate::staleness(1, 3) == 0);

  Request a, b, c;
  a.header.sender = 0;
  a.header.request_id = 1;
  b.header.sender = 1;
  b.header.request_id = 2;
  c.header.sender = 0;
  c.header.request_id = 3;
  gate.park(a, 6, 2);  // waits for slowest 4
  gate.park(b, 4, 2);  // for 2
  CHECK_THROWS_WITH_AS(gate.park(c, 4, 1), doctest::Contains("has 1 reads held already"),
                       std::invalid_argument);
  Request resend = b;
  resend.from = "new socket";
  CHECK(gate.retarget(resend));
  CHECK_FALSE(gate.retarget(c));
  CHECK(gate.release(1).empty());
  const auto first = gate.release(3);
  REQUIRE(first.size() == 1);
  CHECK(first[0].header.request_id == 2);
  CHECK(first[0].from == "new socket");
  CHECK(gate.release(4).size() == 1);
  CHECK(gate.parked() == 0);
}

TEST_CASE("ssp with s = 0 is bulk-synchronous: every read holds every worker's last step") {
  Ps ps(2, ssp(2, 0));
  ps.pull(0, 0);
  ps.pull(1, 0);
  CHECK(ps.replies_to("w0") == std::vector<float>{100});
  // Worker 0 runs ahead: its step-0 gradient is applied, its next read waits.
  ps.push(0, 0, 1);
  CHECK(ps.value() == 99);
  CHECK(ps.replies_to("w0").size() == 1);
  CHECK(ps.sink.accepted_ids.size() == 1);  // recorded at once for a resend
  // Worker 1's step 0 completes the step: both read the state after both.
  ps.push(1, 0, 2);
  CHECK(ps.replies_to("w0") == std::vector<float>{100, 97});
  CHECK(ps.replies_to("w1") == std::vector<float>{100, 97});
  // Step 1: worker 1 first this time; same outcome.
  ps.push(1, 1, 3);
  CHECK(ps.replies_to("w1").size() == 2);
  ps.push(0, 1, 4);
  CHECK(ps.replies_to("w0") == std::vector<float>{100, 97, 90});
  CHECK(ps.replies_to("w1") == std::vector<float>{100, 97, 90});
}

TEST_CASE("ssp with s = 1: a worker runs one step ahead, not two; a lost worker holds no one") {
  Ps ps(2, ssp(2, 1));
  ps.push(0, 0, 1);  // worker 0 completed 1 step: may read for step 1 (1 - 1 <= 0)
  CHECK(ps.replies_to("w0").size() == 1);
  ps.push(0, 1, 1);  // completed 2: reading for step 2 needs the slowest at 1
  CHECK(ps.replies_to("w0").size() == 1);
  ps.push(1, 0, 1);  // the slowest completed 1
  CHECK(ps.replies_to("w0").size() == 2);
  // A plain pull too: worker 0 at step 3 while worker 1 completed 1.
  ps.pull(0, 3);
  CHECK(ps.replies_to("w0").size() == 2);
  // A resend of the held pull is answered once, by the held reply.
  ps.pull(0, 3, ps.next_id);
  CHECK(ps.replies_to("w0").size() == 2);
  const auto stale = ps.registry.prometheus_text();
  CHECK(stale.find("pstrain_ps_ssp_staleness_max_steps 1") != std::string::npos);
  CHECK(stale.find("pstrain_ps_parked_requests{wait=\"read\"} 1") != std::string::npos);
  ps.push(1, 1, 1);  // slowest at 2: the read at 3 goes
  CHECK(ps.replies_to("w0").size() == 3);
}

TEST_CASE("ssp on a shard's copy: who is lost comes from the ps's own coordinator") {
  // The copy counts updates with a coordinator of its own that never hears
  // a worker; its ps's own coordinator found both silent past the timeout.
  RecordingSink sink;
  Coordinator own({"ps 1", 2, std::chrono::seconds(1), WorkerLoss::continue_}, sink);
  own.start(Clock::time_point{});
  own.tick(Clock::time_point{} + std::chrono::seconds(10));
  REQUIRE(own.absent(1));
  auto copy = ssp(2, 1);
  copy.liveness = &own;
  Ps ps(2, copy);
  ps.push(0, 0, 1);
  ps.push(0, 1, 1);  // the read for step 2 would wait for worker 1, which is lost
  CHECK(ps.replies_to("w0").size() == 2);
}

TEST_CASE("staleness_lr: a gradient's learning rate is divided by its staleness") {
  for (const Consistency& consistency :
       {Consistency{.mode = Mode::async, .workers = 2}, ssp(2, 8)}) {
    Ps ps(2, consistency, Ps::sgd(true));
    ps.push(0, 0, 8, 0);  // computed on version 0, the chunk's: staleness 0
    CHECK(ps.value() == 92);
    ps.push(1, 0, 8, 1);  // staleness 0 again
    CHECK(ps.value() == 84);
    ps.push(0, 1, 8, 1);  // one update (worker 1's) since version 1: lr x 1
    CHECK(ps.value() == 76);
    ps.push(1, 1, 8, 1);  // version 3 now, computed on 1: lr / 2
    CHECK(ps.value() == 72);
    ps.push(0, 2, 8, 0);  // version 4, computed on 0: lr / 4
    CHECK(ps.value() == 70);
  }
  // Momentum: the stale gradient enters the velocity scaled, the velocity
  // of the fresh ones before it is not (v = 0.5 v + g / staleness; w -= v).
  OptimizerConfig momentum = Ps::sgd(true);
  momentum.kind = OptimizerKind::momentum;
  momentum.momentum = 0.5f;
  Ps heavy(2, {.mode = Mode::async, .workers = 2}, momentum);
  heavy.push(0, 0, 8, 0);  // v = 8
  CHECK(heavy.value() == 92);
  heavy.push(1, 0, 8, 0);  // staleness 1: v = 4 + 8
  CHECK(heavy.value() == 80);
  heavy.push(0, 1, 8, 0);  // staleness 2: v = 6 + 4
  CHECK(heavy.value() == 70);
  Ps plain(2, {.mode = Mode::async, .workers = 2});
  plain.push(0, 0, 8, 0);
  plain.push(1, 0, 8, 0);  // stale by one, at the full rate without the flag
  plain.push(0, 1, 8, 0);
  CHECK(plain.value() == 76);
}

TEST_CASE("backup: the mean of the first N - b gradients is applied once; late ones dropped") {
  Ps ps(3, backup(3, 1));
  ps.push(0, 0, 2);
  CHECK(ps.value() == 100);  // one of two: held
  CHECK(ps.sink.sent.empty());
  ps.push(1, 0, 4);
  CHECK(ps.value() == 97);  // 100 - mean(2, 4)
  CHECK(ps.replies_to("w0") == std::vector<float>{97});
  CHECK(ps.replies_to("w1") == std::vector<float>{97});
  // Worker 2's gradient of version 0 comes late: never applied, counted.
  ps.push(2, 0, 1000);
  CHECK(ps.value() == 97);
  CHECK(ps.replies_to("w2") == std::vector<float>{97});
  CHECK(ps.registry.prometheus_text().find("pstrain_ps_gradients_dropped_total 1") !=
        std::string::npos);
  // A second gradient of a step from one sender (a restarted process of it)
  // is dropped too, not summed twice.
  ps.push(0, 1, 10, 1);
  ps.push(0, 1, 10, 1);
  CHECK(ps.value() == 97);
  CHECK(ps.replies_to("w0") == std::vector<float>{97, 97});
  ps.push(2, 1, 20, 1);
  CHECK(ps.value() == 82);  // 97 - mean(10, 20)
}

TEST_CASE("backup: a held reply answers its resend once; a stopped worker holds no step") {
  Ps ps(3, backup(3, 1));
  ps.push(0, 0, 2, 0, 50);
  Request resend = ps.chunk_request(Op::push_pull, 0, 0, 0, 50);
  resend.from = "w0 again";
  ps.data.pull(resend);  // the dispatcher answers a recorded push_pull's resend as its pull
  CHECK(ps.sink.sent.empty());
  ps.push(1, 0, 4);
  CHECK(ps.value() == 97);  // worker 0's gradient counted once
  CHECK(ps.replies_to("w0 again") == std::vector<float>{97});
  CHECK(ps.replies_to("w0").empty());
  // Worker 2 never pushes (stopped): each step goes on with the other two.
  for (std::uint64_t v = 1; v <= 3; ++v) {
    ps.push(0, v, 2, v);
    ps.push(1, v, 4, v);
  }
  CHECK(ps.value() == 88);
}

TEST_CASE("backup: a worker that finished pushing is not waited for") {
  Ps ps(2, backup(2, 0));
  ps.push(0, 0, 2);
  CHECK(ps.value() == 100);  // waits for worker 1 (b = 0)
  Request beat;
  beat.from = "w1";
  beat.header.op = Op::progress;
  beat.header.sender = 1;
  wire::Progress{0, true}.write(beat.header);
  ps.coordinator.progress(beat);
  ps.data.tick();
  CHECK(ps.value() == 98);
  CHECK(ps.replies_to("w0") == std::vector<float>{98});
}

TEST_CASE("backup on a shard's copy: it applies its primary's steps until it serves the shard") {
  Ps primary(3, backup(3, 1));
  bool follows = true;
  auto consistency = backup(3, 1);
  consistency.follows = [&follows] { return follows; };
  Ps copy(3, consistency);
  // The primary's step: the mean of workers 0's and 1's gradients, told to
  // the sink (its backup) with who contributed.
  primary.push(0, 0, 2, 0, 11);
  primary.push(1, 0, 4, 0, 12);
  REQUIRE(primary.sink.steps.size() == 1);
  const auto step = primary.sink.steps[0];
  CHECK(step.step.base_version == 0);
  CHECK(step.step.gradients == 2);
  CHECK(step.mean == std::vector<float>(kChunk, 3.0f));
  CHECK(step.contributors == std::vector<std::uint64_t>{11, 12});
  // The copy is forwarded those gradients and one more (which the primary
  // would drop as late, or take in its next step): each is acknowledged at
  // once, none applied.
  copy.push(0, 0, 2, 0, 11);
  copy.push(1, 0, 4, 0, 12);
  copy.push(2, 0, 1000, 0, 13);
  CHECK(copy.value() == 100);
  CHECK(copy.replies_to("w2") == std::vector<float>{100});
  // The primary's step applies as it did there, once.
  std::vector<float> mean = step.mean;
  auto step_request = [&](std::uint64_t id) {
    Request r;
    r.from = "primary";
    r.header.op = Op::step;
    r.header.incarnation = 9;
    r.header.request_id = id;
    r.header.dtype = wire::DType::f32;
    r.header.payload_frames = 1;
    r.header.elements = kChunk;
    step.step.write(r.header);
    r.payload = {reinterpret_cast<const std::uint8_t*>(mean.data()), kChunk * sizeof(float)};
    return r;
  };
  copy.data.step(step_request(1));
  CHECK(copy.value() == primary.value());
  CHECK(copy.value() == 97);
  // A step at another version than the copy's chunk: the copy misses
  // updates, and says so rather than diverge.
  CHECK_THROWS_WITH_AS(copy.data.step(step_request(2)), doctest::Contains("misses updates"),
                       CopyMissesUpdates);
  CHECK(copy.value() == 97);
  // A ps that serves its own shard takes no step from elsewhere.
  CHECK_THROWS_AS(primary.data.step(step_request(3)), std::invalid_argument);
  // Taken over, the copy collects its own steps and tells nobody.
  follows = false;
  copy.push(0, 1, 10, 1);
  copy.push(1, 1, 20, 1);
  CHECK(copy.value() == 82);
  CHECK(copy.sink.steps.empty());
  // Handed back, a step it was collecting is dropped: the primary decides.
  copy.push(0, 2, 10, 2, 40);
  follows = true;
  copy.data.tick();
  copy.push(1, 2, 20, 2);  // acknowledged, not collected
  CHECK(copy.value() == 82);
  // Taken over again, worker 0's gradient of request 40 is gone: worker 1's
  // starts a step of its own.
  follows = false;
  copy.push(1, 2, 20, 2, 41);
  CHECK(copy.value() == 82);
  CHECK(copy.replies_to("w0") == std::vector<float>{100, 82});  // none for request 40
}

TEST_CASE("backup aggregator: how many gradients a step waits for") {
  BackupAggregator one(1);
  CHECK(one.needed(3) == 2);
  CHECK(one.needed(1) == 1);
  CHECK(one.needed(0) == 1);
  BackupAggregator none(0);
  CHECK(none.needed(4) == 4);
}
