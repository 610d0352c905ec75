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
// (the bytes come from another process). It travels as one payload frame,
// so a shard of more than wire::kMaxPayloadBytes cannot be handed over this
// way: encode_shard_state says so before it copies anything.
#include <cstdint>
#include <span>
#include <vector>

#include "server/chunk_store.h"
#include "server/dedup.h"
#include "server/table_store.h"
#include "shared/error.h"

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

}  // namespace pstrain::ps
