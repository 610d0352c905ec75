// CURVE keys (shared/curve_keys.h) and the rights of each identity
// (server/rights.h).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <fstream>

#include "server/rights.h"
#include "shared/messages.h"
#include "tests/support/child_process.h"

using namespace pstrain;
using Role = Identity::Role;

namespace {

unsigned mode_of(const std::filesystem::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

wire::Header header(wire::Op op, std::uint32_t sender, const std::string& name = {}) {
  wire::Header h;
  h.op = op;
  h.sender = sender;
  h.name = name;
  return h;
}

}  // namespace

TEST_CASE("keygen: a secret file of mode 0600 per identity and the public list") {
  TempDir tmp;
  const auto dir = tmp.path() / "keys";
  write_cluster_keys(dir, 2, 3);
  CHECK(mode_of(dir) == 0700);
  const auto list = read_public_keys(dir);
  std::vector<std::string> names;
  for (const auto& p : list) names.push_back(p.who.name());
  CHECK(names ==
        std::vector<std::string>{"ps:0", "ps:1", "worker:0", "worker:1", "worker:2", "tool"});
  for (const auto& p : list) {
    const auto file = dir / (p.who.file_stem() + ".key");
    CHECK(mode_of(file) == 0600);
    const auto pair = read_key_pair(dir, p.who);
    CHECK(pair.public_key == p.key);  // the list names each secret file's own key
    CHECK(pair.secret_key.size() == 40);
  }
  CHECK(list[0].key != list[1].key);
  // Never over an existing set.
  CHECK_THROWS_WITH_AS(write_cluster_keys(dir, 2, 3), doctest::Contains("ps-0.key"), CurveKeyError);
}

TEST_CASE("keygen: missing, malformed and readable keys are named") {
  TempDir tmp;
  const auto dir = tmp.path();
  CHECK_THROWS_WITH_AS(read_public_keys(dir), doctest::Contains("public_keys: cannot read"),
                       CurveKeyError);
  CHECK_THROWS_WITH_AS(read_key_pair(dir, {Role::worker, 1}),
                       doctest::Contains("worker-1.key: cannot read"), CurveKeyError);
  write_cluster_keys(dir / "k", 1, 1);
  std::ofstream(dir / "k" / "public_keys", std::ios::app) << "worker:x 123\n";
  CHECK_THROWS_WITH_AS(read_public_keys(dir / "k"),
                       doctest::Contains("public_keys line 5: 'worker:x' is not"), CurveKeyError);
  std::ofstream(dir / "k" / "worker-0.key", std::ios::trunc) << "not a key\n";
  CHECK_THROWS_WITH_AS(read_key_pair(dir / "k", {Role::worker, 0}),
                       doctest::Contains("worker-0.key: not a CURVE secret key"), CurveKeyError);
  std::filesystem::permissions(dir / "k" / "ps-0.key", std::filesystem::perms::group_read,
                               std::filesystem::perm_options::add);
  CHECK_THROWS_WITH_AS(read_key_pair(dir / "k", {Role::ps, 0}),
                       doctest::Contains("ps-0.key: the secret key is readable by others "
                                         "(mode 640)"),
                       CurveKeyError);
}

TEST_CASE("identity: names round-trip; anything else is no identity") {
  for (const Identity id : {Identity{Role::ps, 3}, Identity{Role::worker, 0}, Identity{}})
    CHECK(Identity::parse(id.name()) == id);
  for (const char* bad : {"", "worker", "worker:", "worker:-1", "worker:1x", "admin:0", "tool:1"})
    CHECK(!Identity::parse(bad));
  CHECK(wire::kv_writer(wire::kv_key(12, "sync/attempt")) == 12u);
  for (const char* bad : {"sync/x", "w/x", "wx/x", "w1", "w-1/x"}) CHECK(!wire::kv_writer(bad));
}

TEST_CASE("rights: each identity may do only what its role needs, as itself") {
  using wire::Op;
  const ps::RightsPolicy async{.workers = 2, .sync = false, .replica_of = std::nullopt},
      sync{.workers = 2, .sync = true, .replica_of = std::nullopt};
  const Identity w0{Role::worker, 0}, w1{Role::worker, 1}, tool{}, ps0{Role::ps, 0};
  const auto allowed = [](const Identity& who, const wire::Header& h,
                          const ps::RightsPolicy& policy) { return !ps::refusal(who, h, policy); };
  for (const auto op : {Op::pull, Op::push, Op::push_pull, Op::init, Op::barrier, Op::heartbeat,
                        Op::done, Op::kv_get, Op::hello, Op::stats}) {
    CAPTURE(wire::to_string(op));
    CHECK(allowed(w1, header(op, 1), async));
    CHECK(!allowed(w1, header(op, 0), async));  // the sender is the key's
  }
  for (const auto op : {Op::pull, Op::push, Op::barrier, Op::heartbeat, Op::done}) {
    CHECK(!allowed(tool, header(op, 1000), async));
    CHECK(!allowed(tool, header(op, 1), async));
    CHECK(!allowed(ps0, header(op, 1000), async));
  }
  CHECK(allowed(tool, header(Op::stats, 1000), async));
  CHECK(allowed(tool, header(Op::shutdown, 1000), async));
  CHECK(allowed(tool, header(Op::snapshot, 1000), async));
  CHECK(*ps::refusal(w0, header(Op::shutdown, 0), async) ==
        "shutdown needs the tool's key; this key is worker:0");
  CHECK(allowed(w0, header(Op::snapshot, 0), async));  // the end of a run
  CHECK(!allowed(w1, header(Op::snapshot, 1), async));
  CHECK(allowed(w0, header(Op::assign, 0), sync));
  CHECK(!allowed(w0, header(Op::assign, 0), async));
  CHECK(!allowed(w1, header(Op::assign, 1), sync));
  CHECK(allowed(w1, header(Op::kv_set, 1, wire::kv_key(1, "k")), async));
  CHECK(*ps::refusal(w1, header(Op::kv_set, 1, wire::kv_key(0, "k")), async) ==
        "kv_set of 'w0/k' writes outside the key's namespace 'w1/'; this key is worker:1");
  CHECK(!allowed(w1, header(Op::kv_set, 1, "k"), async));
  CHECK(!allowed(tool, header(Op::kv_set, 1000, wire::kv_key(1000, "k")), async));
}

TEST_CASE("rights: a backup admits forwarded updates from its primary's key only") {
  using wire::Op;
  // This ps keeps the copy of ps 0's shard (replication.replicas 2).
  const ps::RightsPolicy policy{.workers = 2, .sync = false, .replica_of = 0};
  const Identity ps0{Role::ps, 0}, ps2{Role::ps, 2}, w1{Role::worker, 1};
  for (const auto op : {Op::init, Op::push, Op::push_pull, Op::assign}) {
    CAPTURE(wire::to_string(op));
    CHECK(!ps::refusal(ps0, header(op, 1), policy, /*forward=*/true));  // a worker's update
    CHECK(ps::refusal(ps2, header(op, 1), policy, true));
    CHECK(ps::refusal(w1, header(op, 1), policy, true));
    CHECK(ps::refusal(ps0, header(op, 1), policy, false));  // not as a forward
  }
  CHECK(*ps::refusal(ps0, header(Op::pull, 1), policy, true) ==
        "pull is not forwarded between ps; this key is ps:0");
  CHECK(*ps::refusal(ps2, header(Op::push, 1), policy, true) ==
        "forwarded push needs the key of the ps whose shard's copy this is; this key is ps:2");
}
