#pragma once
// The ps's record of the updates it applied, per client, so that a resent
// request is answered instead of applied a second time.
//
// A client resends a data request it got no reply to (client/ps/ps_client.h)
// with the same request id; the id is a sequence number within the client's
// incarnation (random per process start). The record keeps, per incarnation,
// the ids of the last kWindow applied init, push, push_pull and assign
// requests and the chunk version each replied with. pull is not recorded: it
// changes nothing, so doing it again is its answer.
//
//   Dedup dedup;
//   if (auto seen = dedup.find(request.header)) { answer from *seen; }
//   else { apply; dedup.record(request.header, version_replied); }
//
// What a resend is answered with: init, push and assign get the version they
// replied with the first time; push_pull gets the chunk's values and version
// as they are now (the request loop answers it as a pull): keeping every
// replied buffer alive instead would make each later update copy its chunk
// (copy-on-write) and hold window x chunk bytes per client. The values then
// include the resent update and possibly later ones, as a push followed by a
// pull would.
//
// Bounds, so that no peer can make the ps grow without limit:
// - per incarnation, the last kWindow applied ids (older ones are evicted,
//   lowest id first). An id at or below the highest evicted one that is not
//   in the window cannot be told apart from a resend of an evicted request:
//   it is refused (Verdict::too_old) rather than risk a second application.
//   A genuine resend falls inside the window unless its client applied more
//   than kWindow later updates at this ps meanwhile, i.e. had that many in
//   flight to one ps at once (a variable of over 256 MB per ps at the default
//   chunk size): such a resend fails with an error instead.
// - at most kClients incarnations; the least recently used is dropped when a
//   new one would exceed that. A hello from a new incarnation of a sender
//   drops the sender's other incarnations: that process has restarted, and
//   its old requests will never be resent.
// Memory: about kClients x kWindow x 64 B (a std::map node; 17 MB) at most.
//
// Requests with incarnation 0 (tools and tests speaking the wire protocol by
// hand) are neither recorded nor looked up.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shared/protocol.h"

namespace pstrain::ps {

class Dedup {
 public:
  static constexpr std::size_t kWindow = 1024;
  static constexpr std::size_t kClients = 256;

  explicit Dedup(std::size_t window = kWindow, std::size_t clients = kClients);

  // Whether `op` is recorded: the ops that change a chunk.
  static bool recorded(wire::Op op);

  enum class Verdict { fresh, resent, too_old };
  struct Seen {
    Verdict verdict = Verdict::fresh;
    std::uint64_t version = 0;  // resent: the version the first reply carried
  };
  // What `request` is: new, a resend of an applied request, or too old to
  // tell. fresh for ops that are not recorded and for incarnation 0.
  Seen find(const wire::Header& request);
  // Records that `request` was applied and answered with `version`.
  void record(const wire::Header& request, std::uint64_t version);
  // A hello: forgets every other incarnation of the request's sender.
  void hello(const wire::Header& request);

  std::size_t clients() const { return clients_.size(); }
  std::size_t entries() const;  // recorded requests over all clients

  // The record as data, for a shard's state handed to another ps
  // (server/shard_state.h): what it holds of one incarnation.
  struct ClientRecord {
    std::uint64_t incarnation = 0;
    std::uint32_t sender = 0;
    std::uint64_t evicted_below = 0;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> applied;  // (request id, version)
  };
  std::vector<ClientRecord> records() const;
  // Replaces the record with `records` (another ps's); throws
  // std::invalid_argument when they exceed this record's bounds.
  void restore(const std::vector<ClientRecord>& records);

 private:
  struct Client {
    std::uint32_t sender = 0;
    std::uint64_t last_used = 0;                     // tick of the last find or record
    std::uint64_t evicted_below = 0;                 // ids <= this may have been evicted
    std::map<std::uint64_t, std::uint64_t> applied;  // request id -> version
  };
  Client& client(const wire::Header& request);

  std::size_t window_;
  std::size_t max_clients_;
  std::uint64_t tick_ = 0;
  std::unordered_map<std::uint64_t, Client> clients_;  // by incarnation
};

}  // namespace pstrain::ps
