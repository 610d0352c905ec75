// The ps's record of applied requests (server/dedup.h): a resend is
// recognised with the version its first reply carried, the record stays
// within its bounds, and what it cannot tell any more is refused, never
// taken for new.
#include <doctest/doctest.h>

#include "server/dedup.h"

using namespace pstrain;
using namespace pstrain::ps;
using wire::Op;
using Verdict = Dedup::Verdict;

namespace {

wire::Header request(Op op, std::uint64_t incarnation, std::uint64_t id, std::uint32_t sender = 0) {
  wire::Header h;
  h.op = op;
  h.incarnation = incarnation;
  h.request_id = id;
  h.sender = sender;
  return h;
}

}  // namespace

TEST_CASE("dedup: an applied update is recognised when resent, with its first version") {
  Dedup dedup;
  for (const auto op : {Op::init, Op::push, Op::push_pull, Op::assign}) {
    CAPTURE(wire::to_string(op));
    const auto r = request(op, 7, 10 + static_cast<int>(op));
    CHECK(dedup.find(r).verdict == Verdict::fresh);
    dedup.record(r, 41 + static_cast<int>(op));
    const auto seen = dedup.find(r);
    CHECK(seen.verdict == Verdict::resent);
    CHECK(seen.version == 41u + static_cast<unsigned>(op));
  }
  // The same id from another incarnation is another request.
  CHECK(dedup.find(request(Op::push, 8, 10 + static_cast<int>(Op::push))).verdict ==
        Verdict::fresh);
  CHECK(dedup.entries() == 4);
}

TEST_CASE("dedup: pulls, control ops and incarnation 0 are not recorded") {
  Dedup dedup;
  dedup.record(request(Op::pull, 7, 1), 3);
  dedup.record(request(Op::heartbeat, 7, 2), 3);
  dedup.record(request(Op::push, 0, 3), 3);  // a sender that never resends
  CHECK(dedup.entries() == 0);
  CHECK(dedup.find(request(Op::pull, 7, 1)).verdict == Verdict::fresh);
  CHECK(dedup.find(request(Op::push, 0, 3)).verdict == Verdict::fresh);
}

TEST_CASE("dedup: the window keeps the newest ids; older ones are too old, never fresh") {
  Dedup dedup(/*window=*/4, /*clients=*/8);
  // Ids of one incarnation need not be contiguous at one ps (pulls and other
  // servers' requests take numbers too).
  for (std::uint64_t id : {2, 5, 6, 9, 11, 12}) dedup.record(request(Op::push, 7, id), id * 10);
  CHECK(dedup.entries() == 4);
  // Evicted: 2 and 5.
  CHECK(dedup.find(request(Op::push, 7, 2)).verdict == Verdict::too_old);
  CHECK(dedup.find(request(Op::push, 7, 5)).verdict == Verdict::too_old);
  // Never seen, but at or below an evicted id: it may have been applied.
  CHECK(dedup.find(request(Op::push, 7, 1)).verdict == Verdict::too_old);
  CHECK(dedup.find(request(Op::push, 7, 4)).verdict == Verdict::too_old);
  // Kept.
  for (std::uint64_t id : {6, 9, 11, 12}) {
    const auto seen = dedup.find(request(Op::push, 7, id));
    CHECK(seen.verdict == Verdict::resent);
    CHECK(seen.version == id * 10);
  }
  // Above the evicted ones and not recorded: new (a resend of a request
  // that was lost before it was applied, or simply the next one).
  CHECK(dedup.find(request(Op::push, 7, 7)).verdict == Verdict::fresh);
  CHECK(dedup.find(request(Op::push, 7, 13)).verdict == Verdict::fresh);
}

TEST_CASE("dedup: at most `clients` incarnations; the least recently used is dropped") {
  Dedup dedup(/*window=*/16, /*clients=*/2);
  dedup.record(request(Op::push, 100, 1, 0), 1);
  dedup.record(request(Op::push, 200, 1, 1), 1);
  CHECK(dedup.find(request(Op::push, 100, 1)).verdict == Verdict::resent);  // 100 used last
  dedup.record(request(Op::push, 300, 1, 2), 1);
  CHECK(dedup.clients() == 2);
  CHECK(dedup.find(request(Op::push, 100, 1)).verdict == Verdict::resent);
  CHECK(dedup.find(request(Op::push, 300, 1)).verdict == Verdict::resent);
  CHECK(dedup.find(request(Op::push, 200, 1)).verdict == Verdict::fresh);  // forgotten
}

TEST_CASE("dedup: a hello from a new incarnation drops the sender's old ones") {
  Dedup dedup;
  dedup.record(request(Op::push, 100, 1, /*sender=*/3), 1);
  dedup.record(request(Op::push, 200, 1, /*sender=*/4), 1);
  // The same incarnation saying hello again (an evaluator's client) keeps it.
  dedup.hello(request(Op::hello, 100, 2, 3));
  CHECK(dedup.find(request(Op::push, 100, 1)).verdict == Verdict::resent);
  // Sender 3 restarted.
  dedup.hello(request(Op::hello, 101, 1, 3));
  CHECK(dedup.find(request(Op::push, 100, 1)).verdict == Verdict::fresh);
  CHECK(dedup.find(request(Op::push, 200, 1)).verdict == Verdict::resent);
  CHECK(dedup.clients() == 1);
}
