#pragma once
// A shard's whole state as one message between two ps, for re-join
// (server/replicator.h, "Re-join"): its chunks with their values, optimizer
// state and versions, and the record of applied requests (server/dedup.h),
// and its embedding tables' rows with their optimizer state and clocks, so
// that the ps receiving it serves on exactly where the sender stood: a
// request the sender applied is answered from the record there, never
// applied twice.
//
//   auto bytes = encode_shard_state(store.refs(), &tables, clocks, dedup);  // the sender
//   ShardState state = decode_shard_state(bytes);                    // the receiver
//   store.restore(std::move(state.chunks)); dedup.restore(state.record);
//   for (const auto& t : state.tables) tables.replace(t);
//
// The encoding (shard_state.cc) is the fields below back to back, every
// length checked against the bytes left before anything is sized by it
// (the bytes come from another process). It travels in pieces of at most
// kStatePieceBytes, one per message (wire::ShardPiece names each), which
// StateAssembly puts back together:
//
//   for (std::size_t i = 0; i < state_pieces(bytes.size()); ++i)
//     send(i, bytes.size(), state_piece(bytes, i));                // the sender
//   assembly.add(transfer, i, total, payload);                     // the receiver
//   if (assembly.complete()) decode_shard_state(assembly.take());
//
// A state is at most max_state_bytes(): encode_shard_state says so before
// it copies anything, and an assembly refuses a larger one before it
// allocates.
#include <cstdint>
#include <span>
#include <vector>

#include "server/chunk_store.h"
#include "server/dedup.h"
#include "server/table_store.h"
#include "shared/error.h"
#include "shared/protocol.h"

namespace pstrain::ps {

struct ShardState {
  std::vector<SnapshotRecord> chunks;
  std::vector<TableSnapshot> tables;  // whole: nothing removed
  // The mode's per-worker clocks (ssp: steps each worker completed; empty
  // in the other modes), so the receiver's gate holds reads as the sender's.
  std::vector<std::uint64_t> clocks;
  std::vector<Dedup::ClientRecord> record;
  // The updates it holds: its chunks' versions and its tables' clocks
  // (a table's clock counts the pushes applied to it).
  std::uint64_t updates() const;
  std::uint64_t rows() const;
};

// What cannot be encoded (too large) or decoded (not a shard's state).
struct ShardStateError : pstrain::Error {
  using pstrain::Error::Error;
};

// `tables`: the shard's rows (none: a shard without tables); read on the
// ps thread, as every call of the store is.
std::vector<std::uint8_t> encode_shard_state(const std::vector<HeldChunk>& chunks,
                                             TableStore* tables,
                                             std::span<const std::uint64_t> clocks,
                                             const Dedup& record);
ShardState decode_shard_state(std::span<const std::uint8_t> bytes);

// A piece's size: a quarter of what one frame may carry, so that the few
// answers to a joining ps's asks that can be in flight at once stay within
// a ps's send budget for one peer (server/send_budget.h).
inline constexpr std::size_t kStatePieceBytes = wire::kMaxPayloadBytes / 4;

// The largest state a ps sends or takes: half this host's memory (the
// receiver holds the assembled bytes and the decoded shard at once).
std::uint64_t max_state_bytes();
// How many pieces a state of `bytes` travels in, and piece `index` of it.
std::size_t state_pieces(std::size_t bytes);
std::span<const std::uint8_t> state_piece(std::span<const std::uint8_t> state, std::size_t index);

// One state put back together from its pieces, which arrive in order but
// may come twice (an answer sent again) or be lost (asked for again).
class StateAssembly {
 public:
  // Piece `index` of state `transfer` (an id its sender gives each cut), of
  // `total` bytes. Piece 0 of another transfer starts afresh, a later one
  // drops what it held (next() is 0 again); the next piece of this one is
  // taken; any other is ignored (false). Throws
  // ShardStateError, and drops what it held, for a total past
  // max_state_bytes() or a piece of the wrong size.
  bool add(std::uint64_t transfer, std::uint64_t index, std::uint64_t total,
           std::span<const std::uint8_t> bytes);
  bool complete() const { return started_ && bytes_.size() == total_; }
  // The piece to ask for next (0 before any).
  std::uint64_t next() const { return next_; }
  // The whole state once complete(); the assembly is empty again.
  std::vector<std::uint8_t> take();
  void clear();

 private:
  bool started_ = false;
  std::uint64_t transfer_ = 0, total_ = 0, next_ = 0;
  std::vector<std::uint8_t> bytes_;
};

}  // namespace pstrain::ps
