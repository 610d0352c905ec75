#pragma once
// Stale-synchronous parallel (mode: ssp, Ho et al. 2013): updates are applied
// as they arrive, as in async mode, but a worker at clock c (the steps it has
// completed) may read the weights only once every counted worker has
// completed at least c - s steps, s being train.staleness_bound. The ps
// holds a read that comes too early (the reply to a push_pull is the read of
// the pusher's next step) and answers it when the slowest worker catches up.
// s = 0 is bulk-synchronous through the ps; a large s approaches async.
//
// The clocks come with the requests (wire::ChunkRequest::clock): a push of
// step k means its sender completed k + 1 steps. Counted workers are those
// not lost (Coordinator::absent): a lost worker no longer holds anyone back,
// and one that finished keeps its last clock, which is every step.
//
// Staleness in clocks of an applied update (what the bound guarantees): the
// pusher's step minus the slowest counted worker's completed steps when it is
// applied, at least 0. It never exceeds s: the pusher read its weights when
// the slowest had completed at least step - s steps, and clocks only grow.
//
// Bounds: a worker has at most one read per chunk in flight, so reads parked
// per sender are capped at the chunks the ps holds (set by the caller); one
// beyond is refused. Memory: a Request header per parked read, no payload.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "server/request.h"

namespace pstrain::ps {

class SspGate {
 public:
  // `workers`: senders 0 .. workers-1 are workers; `bound`: s.
  SspGate(std::uint32_t workers, std::uint64_t bound);

  std::uint64_t bound() const { return bound_; }
  // Worker `worker` completed `steps` steps (clocks only go up; a sender that
  // is no worker is ignored).
  void completed(std::uint32_t worker, std::uint64_t steps);
  // The steps each worker completed, by index: what a shard's state carries
  // to the ps that serves it next (server/shard_state.h).
  const std::vector<std::uint64_t>& clocks() const { return completed_; }
  // Takes such clocks (those of workers beyond this gate's are ignored);
  // clocks only go up.
  void adopt_clocks(std::span<const std::uint64_t> clocks);
  // The fewest steps any counted worker completed (`counted` says which);
  // UINT64_MAX when none is counted.
  std::uint64_t slowest(const std::function<bool(std::uint32_t)>& counted) const;
  // Whether a read at `clock` may be answered when the slowest completed `slowest`.
  bool may_read(std::uint64_t clock, std::uint64_t slowest) const;
  // An update pushed from step `step`, applied when the slowest completed `slowest`.
  static std::uint64_t staleness(std::uint64_t step, std::uint64_t slowest);

  // Holds `read` (its payload dropped) until the slowest reaches clock - s.
  // Throws std::invalid_argument when its sender has `limit` reads held.
  void park(const Request& read, std::uint64_t clock, std::size_t limit);
  // A resend of a held read (same sender, incarnation and request id): the
  // held one will answer it, now to the resend's peer (a client that
  // replaced its socket). False when no such read is held.
  bool retarget(const Request& resend);
  // The held reads `slowest` lets go, oldest clock first, removed.
  std::vector<Request> release(std::uint64_t slowest);
  std::size_t parked() const { return parked_.size(); }

 private:
  std::uint64_t bound_;
  std::vector<std::uint64_t> completed_;          // per worker
  std::multimap<std::uint64_t, Request> parked_;  // by the clock each waits for
  std::map<std::uint32_t, std::size_t> parked_by_sender_;
};

}  // namespace pstrain::ps
