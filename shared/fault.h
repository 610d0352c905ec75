#pragma once
// Fault injection for tests (net.fault in docs/config.md), in the spirit of
// ps-lite's PS_DROP_MSG: drops or delays a fraction of the data messages a
// process sends, so that resends and the ps's record of applied requests
// (server/dedup.h) are exercised on loopback. Off (and free) unless
// configured. A client drops requests (lost before they are applied), a ps
// drops replies (applied, but the client does not know).
//
// Only data requests and their replies are subject to it (wire::Op init,
// pull, push, push_pull, assign, the sparse ops, and a primary's step to its
// backup): they are the ones a sender resends.
//
// Thread rules: none of its own; each sender (a PsClient, the request loop)
// owns one and uses it from its thread.
//
// The generator is seeded from the run's seed and the process's role and
// index, so a run draws the same sequence of decisions; which message meets
// which decision still depends on timing.
#include <cstdint>
#include <random>

#include "shared/protocol.h"

namespace pstrain {

struct FaultConfig {
  double drop = 0;      // fraction of messages dropped, in [0, 1)
  double delay_ms = 0;  // every message not dropped is held this long
};

class FaultInjector {
 public:
  FaultInjector(FaultConfig config, std::uint64_t seed);

  // Whether `op`'s message is to be dropped; sleeps delay_ms first when it
  // is not. Always false for ops other than the data ops.
  bool drop(wire::Op op);

 private:
  FaultConfig config_;
  std::mt19937_64 random_;
  std::bernoulli_distribution dropped_;
};

}  // namespace pstrain
