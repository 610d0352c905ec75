#pragma once
// The ps's statistics: the counters the request loop keeps and the JSON the
// stats op answers. Every figure the stats op reports is gathered here, so
// moving them onto another metrics system is a change to this module only.
//
// The JSON object's keys (tests and tools read them by name):
//   ps, requests (an object: count per op name), errors, malformed,
//   bytes_in, bytes_out, optimizer_seconds, updates, copies_on_write,
//   chunks, elements, version_sum, version_max, global_samples,
//   parked_barrier, parked_kv_get, uptime_seconds.
// `parked_*` count the requests waiting right now, so a test can see that a
// barrier or kv_get has arrived and is parked before it goes on.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <array>
#include <cstdint>
#include <string>

#include "server/chunk_store.h"
#include "server/coordinator.h"
#include "server/request.h"

namespace pstrain::ps {

class PsStats {
 public:
  PsStats(std::uint32_t ps_index, Clock::time_point started);

  void received(std::size_t bytes) { bytes_in_ += bytes; }  // every frame that came in
  void sent(std::size_t bytes) { bytes_out_ += bytes; }     // every frame that went out
  void malformed() { ++malformed_; }  // a message that is not a decodable request
  void request(wire::Op op) { ++requests_[static_cast<std::size_t>(op)]; }  // decoded
  void error() { ++errors_; }         // a request answered with an error

  std::string json(const ChunkStore& store, const Coordinator::Figures& coordinator,
                   Clock::time_point now) const;

  // Registers the stats op, answering json() of this ps's store and coordinator.
  void add_handler(Handlers& handlers, ReplySink& sink, const ChunkStore& store,
                   const Coordinator& coordinator) const;

 private:
  std::uint32_t ps_index_;
  Clock::time_point started_;
  std::array<std::uint64_t, wire::kMaxOp + 1> requests_{};
  std::uint64_t errors_ = 0;
  std::uint64_t malformed_ = 0;
  std::uint64_t bytes_in_ = 0;
  std::uint64_t bytes_out_ = 0;
};

}  // namespace pstrain::ps
