// Rendezvous through ps 0, with a ps role served on a thread of this process:
// attempts, Gloo communicators made by the factory over the rendezvous store, and
// (when the CUDA library is built) the NCCL id handed from worker 0 to the
// others.
#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <span>
#include <thread>

#include "client/comm/communicator_factory.h"
#include "client/comm/rendezvous.h"
#include "client/compute/cpu/cpu_backend.h"
#include "client/ps/kv_store.h"
#include "client/ps/ps_client.h"
#include "server/ps_role.h"
#include "shared/messages.h"
#include "tests/support/child_process.h"

namespace pstrain {
namespace {

// ps 0 on a free loopback port, served until the fixture is destroyed.
struct LocalPs {
  explicit LocalPs(const std::string& net = "{request_timeout: 5}") {
    config =
        parse_config("job: rendezvous\nrun_dir: " + dir.path().string() +
                     "\nmode: sync\nps: [{host: 127.0.0.1, port: " + std::to_string(free_port()) +
                     "}]\nworkers: {count: 2}\ndata: {name: synthetic}\n"
                     "net: " +
                     net + "\n");
    served = std::async(std::launch::async, [this] { return run_ps_role(config, 0, {}); });
  }
  ~LocalPs() {
    if (!served.valid()) return;  // the test collected the exit code
    if (served.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      PsClient(config, 0, map()).shutdown(0);
    served.get();
  }
  ShardMap map() const { return ShardMap({{"w", 4, {}}}, 1); }

  TempDir dir;
  ClusterConfig config;
  std::future<int> served;
};

// Runs body(rank, ps client) for both workers at once.
template <class Body>
auto both(const LocalPs& ps, Body body) {
  auto run = [&](std::uint32_t rank) {
    PsClient client(ps.config, rank, ps.map());
    client.hello();
    return body(rank, client);
  };
  auto other = std::async(std::launch::async, run, 1u);
  auto mine = run(0);
  return std::array{mine, other.get()};
}

TEST_CASE("sync rendezvous: workers agree on an attempt, and a new join gets a new one") {
  LocalPs ps;
  const auto first = both(ps, [&](std::uint32_t rank, PsClient& client) {
    return join_sync_run(client, ps.config, rank);
  });
  CHECK(first[0].prefix == first[1].prefix);
  CHECK(first[0].prefix.starts_with("sync/"));
  CHECK(first[0].number == first[1].number);
  CHECK(first[0].step == 0);  // nothing recorded: the initial weights
  // Both start afresh (a run restarted against a ps that is still up):
  // worker 1 is a member of the newest attempt, so it waits for the next.
  const auto second = both(ps, [&](std::uint32_t rank, PsClient& client) {
    return join_sync_run(client, ps.config, rank);
  });
  CHECK(second[0].prefix == second[1].prefix);
  CHECK(second[0].prefix != first[0].prefix);
  CHECK(second[0].number == first[0].number + 1);
}

TEST_CASE(
    "sync rendezvous: a survivor and a restarted worker meet in the next attempt at the "
    "recorded step") {
  LocalPs ps;
  const auto first = both(ps, [&](std::uint32_t rank, PsClient& client) {
    return join_sync_run(client, ps.config, rank);
  });
  {
    PsClient client(ps.config, 0, ps.map());
    record_sync_step(client, ps.config, 40);
  }
  // The roles of a failure of worker 1, then of worker 0: the survivor says
  // which attempt failed, the restarted one joins from scratch.
  for (const std::uint32_t restarted : {1u, 0u}) {
    CAPTURE(restarted);
    const std::uint64_t failed = first[0].number + (restarted == 1 ? 0 : 1);
    const auto next = both(ps, [&](std::uint32_t rank, PsClient& client) {
      return join_sync_run(client, ps.config, rank, rank == restarted ? 0 : failed);
    });
    CHECK(next[0].number == failed + 1);
    CHECK(next[1].number == failed + 1);
    CHECK(next[0].prefix == next[1].prefix);
    CHECK(next[0].step == 40);
    CHECK(next[1].step == 40);
  }
}

TEST_CASE("sync rendezvous: the factory connects Gloo through ps 0 on CPU backends") {
  LocalPs ps;
  const auto sums = both(ps, [&](std::uint32_t rank, PsClient& client) {
    auto backend = make_cpu_backend(1);
    const SyncAttempt attempt = join_sync_run(client, ps.config, rank);
    auto comm = make_communicator(ps.config, rank, *backend, client, attempt.prefix);
    CHECK(comm->name() == "gloo");
    CHECK(comm->size() == 2);
    CHECK(comm->rank() == static_cast<int>(rank));
    std::vector<float> v(3, static_cast<float>(rank + 1));
    comm->allreduce_sum(v.data(), v.size());
    std::vector<float> b{rank == 1 ? 7.0f : 0.0f};
    comm->broadcast(b.data(), 1, 1);
    comm->barrier();
    return v[2] + b[0];
  });
  CHECK(sums[0] == 10.0f);  // 1 + 2, and 7 from worker 1
  CHECK(sums[1] == 10.0f);
}

TEST_CASE("sync rendezvous: a worker that never joins ends the wait, naming it") {
  LocalPs ps("{request_timeout: 0.5, worker_timeout: 1, heartbeat: 0.2}");
  PsClient client(ps.config, 0, ps.map());
  client.hello();
  CHECK_THROWS_WITH_AS(join_sync_run(client, ps.config, 0),
                       doctest::Contains("waiting for worker 1 to join attempt 1"), CommError);
  CHECK(ps.served.get() == 3);  // ps 0 named the silent worker and exited
}

// A KvStore of the test's own (no ps): keys in memory, namespaced by
// writer as ps 0 does, and keep_alive() calls counted.
class MemoryStore {
 public:
  class Client : public KvStore {
   public:
    Client(MemoryStore& store, std::uint32_t writer) : store_(store), writer_(writer) {}
    void kv_set(const std::string& key, std::span<const std::uint8_t> value) override {
      std::lock_guard lock(store_.mutex_);
      store_.keys_[wire::kv_key(writer_, key)].assign(value.begin(), value.end());
      store_.changed_.notify_all();
    }
    std::vector<std::uint8_t> kv_get(std::uint32_t writer, const std::string& key,
                                     double timeout_s) override {
      std::unique_lock lock(store_.mutex_);
      const auto full = wire::kv_key(writer, key);
      if (!store_.changed_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                    [&] { return store_.keys_.contains(full); }))
        throw PsError("memory store: no '" + full + "'");
      return store_.keys_[full];
    }
    void keep_alive() override {
      std::lock_guard lock(store_.mutex_);
      ++store_.keep_alives_;
    }

   private:
    MemoryStore& store_;
    std::uint32_t writer_;
  };
  int keep_alives() {
    std::lock_guard lock(mutex_);
    return keep_alives_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<std::uint8_t>> keys_;
  int keep_alives_ = 0;
};

TEST_CASE("sync rendezvous: on a store of its own, attempts resume at the recorded step") {
  const auto config = parse_config(
      "job: rendezvous\nmode: sync\nps: [{host: 127.0.0.1, port: 1}]\nworkers: {count: 2}\n"
      "data: {name: synthetic}\nnet: {worker_timeout: 2, heartbeat: 0.05}\n");
  MemoryStore store;
  MemoryStore::Client w0(store, 0), w1(store, 1);
  const auto join = [&](std::uint64_t failed) {
    // Worker 1 comes late: it waits for worker 0 to open the attempt,
    // keeping itself alive meanwhile.
    auto late = std::async(std::launch::async, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return join_sync_run(w0, config, 0, failed);
    });
    const SyncAttempt one = join_sync_run(w1, config, 1, failed);
    const SyncAttempt zero = late.get();
    CHECK(one.prefix == zero.prefix);
    CHECK(one.step == zero.step);
    return zero;
  };
  const SyncAttempt first = join(0);
  CHECK(first.number == 1);
  CHECK(first.step == 0);
  CHECK(store.keep_alives() > 0);
  record_sync_step(w0, config, 40);
  // A peer failed in attempt 1: the next resumes after step 40.
  const SyncAttempt second = join(first.number);
  CHECK(second.number == 2);
  CHECK(second.step == 40);
  CHECK(second.prefix != first.prefix);
}

#if defined(PSTRAIN_CUDA_LIBRARY)
TEST_CASE("sync rendezvous: worker 0's NCCL id reaches worker 1 through ps 0") {
  ::setenv("PSTRAIN_CUDA_LIB", PSTRAIN_CUDA_LIBRARY, 1);
  LocalPs ps;
  const auto ids = both(ps, [&](std::uint32_t rank, PsClient& client) {
    return share_nccl_id(client, join_sync_run(client, ps.config, rank).prefix, rank,
                         ps.config.net.request_timeout);
  });
  CHECK(ids[0] == ids[1]);
  CHECK(ids[0] != cuda::NcclId{});
}
#endif

}  // namespace
}  // namespace pstrain
