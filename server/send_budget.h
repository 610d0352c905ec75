#pragma once
// How many bytes of replies the ps may have handed to ZeroMQ and not yet
// seen leave, per peer and in all: what keeps a peer that never reads its
// replies from growing the ps without bound. ZeroMQ's send queue itself is
// unbounded (sndhwm 0), so that no legitimate reply is dropped by it
// silently; this budget decides instead.
//
// Every reply frame the request loop sends holds a Claim on its cost until
// ZeroMQ releases the frame (its free function, on ZeroMQ's I/O thread),
// which is once the bytes are in the kernel's socket buffer or the peer is
// gone. A reply whose claim would take its peer past kPerPeerBytes, or all
// peers past kTotalBytes, is not sent: the request loop drops it, counts it
// and logs the peer once (docs/security.md, "Limits that hold for every
// peer"). A client that reads resends after its timeout (docs/failures.md).
//
// What a reply costs (cost()): its header and bytes payload, and
// kFrameOverhead per frame for ZeroMQ's own bookkeeping. A chunk's value
// buffer is not counted: it is the store's own buffer, shared with the
// reply (server/request.h), and costs no memory beyond the store's when it
// is sent. Legitimate traffic is far below the budgets: a worker's pull of
// every chunk at once costs its headers, a kv value is a few bytes, the
// largest bytes payload (kv_set's limit, wire::kMaxFrameBytes) fits twice.
//
//   if (auto claim = budget.claim(peer, SendBudget::cost(header, payload))) ...
//   // the frames' free functions hold `claim`; its destructor gives it back
//
// Thread rules: claim(), queued() and forget_idle() run on the ps thread;
// a Claim may be destroyed on any thread (the counts are atomic). Claims
// may outlive the SendBudget.
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>

#include "server/request.h"

namespace pstrain::ps {

class SendBudget {
 public:
  static constexpr std::size_t kPerPeerBytes = 2 * wire::kMaxFrameBytes;  // 32 MiB
  static constexpr std::size_t kTotalBytes = 4 * wire::kMaxFrameBytes;    // 64 MiB
  // Per queued frame: ZeroMQ's message and pipe entries, rounded up.
  static constexpr std::size_t kFrameOverhead = 256;

  // Budgets other than the defaults are for tests.
  explicit SendBudget(std::size_t per_peer = kPerPeerBytes, std::size_t total = kTotalBytes);

  // Queued bytes claimed for one reply; destroying it gives them back.
  class Claim {
   public:
    ~Claim();
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;

   private:
    friend class SendBudget;
    Claim(std::shared_ptr<std::atomic<std::size_t>> peer,
          std::shared_ptr<std::atomic<std::size_t>> total, std::size_t bytes);
    std::shared_ptr<std::atomic<std::size_t>> peer_, total_;
    std::size_t bytes_;
  };

  // What sending a reply with this encoded header and payload costs.
  static std::size_t cost(std::size_t header_bytes, const ReplyPayload& payload);

  // A claim on `bytes` for a reply to `peer`, or nullptr when that would take
  // the peer past its budget or all peers past the total.
  std::unique_ptr<Claim> claim(const Peer& peer, std::size_t bytes);

  std::size_t queued(const Peer& peer) const;  // claimed and not yet given back
  std::size_t queued() const;                  // all peers
  // Forgets peers with nothing queued, so that the table does not grow with
  // every peer ever answered. The request loop calls it between batches.
  void forget_idle();

 private:
  std::size_t per_peer_, total_limit_;
  std::shared_ptr<std::atomic<std::size_t>> total_;
  std::unordered_map<Peer, std::shared_ptr<std::atomic<std::size_t>>> peers_;
};

}  // namespace pstrain::ps
