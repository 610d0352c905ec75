#pragma once
// A prediction of a job's samples/s from its shape and its network, before
// the machines are rented: what `pstrain --plan` prints for each number of
// parameter servers and wire format (docs/scaling.md, "The planner"), and
// what the scaling curves check it against.
//
// The cluster it assumes: every ps and every worker on a host of its own,
// each host with a full-duplex link of `link_bits_per_s` each way; TCP over
// Ethernet, whose headers cost 66 bytes per 1448-byte segment on the link.
// Per step a worker pushes every dense variable's gradient and pulls its
// weights back, variable by variable (async, ssp, backup); a ps gets its
// shard's share (ShardMap::bytes_on) from every worker and applies it. A
// round of W worker steps is bound by the slowest of:
//   - a worker:  its step and its own link, simulated chunk by chunk: the
//                forward takes a third of step_ms and the backward the rest,
//                each variable's gradient (the last variable first) ready
//                after a share of the backward proportional to its size;
//                a chunk is pushed when its gradient is ready and the link
//                is free, and its new weights come back on the other
//                direction once the push has arrived; the next step starts
//                when the last reply is in;
//   - a ps link: W x its shard, each way, on the busiest ps's link;
//   - a ps apply: W x its shard through the optimizer at apply_bytes_per_s.
// Mode sync all-reduces float32 gradients between the workers in a ring,
// 2 (W-1)/W of each chunk's bytes each way per worker, chunk by chunk as the
// backward produces them (the chunks stand in for sync's 256 KiB buckets),
// and worker 0 writes the weights to the servers every sync_every steps.
// Embedding rows (row_bytes): pulled before the forward, so the forward
// waits for them, and pushed after the backward, float32 both ways, their
// share of every ps's link and apply. Not modelled: the CPU the kernel
// spends on the bytes (a host whose cores are busy with compute moves less),
// latency beyond a chunk's time, and a prefetch of the next batch's rows.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shared/shard_map.h"

namespace pstrain {

struct ThroughputInput {
  std::vector<VariableSpec> variables;
  std::uint32_t workers = 1;
  std::uint32_t servers = 1;
  std::uint32_t batch = 64;  // per worker and step
  std::uint64_t chunk_bytes = ShardMap::kDefaultChunkBytes;
  double step_ms = 1;  // a worker's forward and backward
  double link_bits_per_s = 1e9;
  double wire_bytes_per_value = 4;  // of pushes and pulls: 4 fp32, 2 bf16 and fp16
  double apply_bytes_per_s = 4e9;   // float32 gradient one ps applies per second
  bool allreduce = false;           // mode sync
  std::uint32_t sync_every = 50;    // sync: steps between worker 0's writes
  // Embedding rows a worker pulls before a step's forward and whose
  // gradients it pushes after the backward, float32 bytes each way (the
  // batch's unique rows, spread evenly over the servers).
  double row_bytes = 0;
};

struct ThroughputPrediction {
  double samples_per_s = 0;  // all workers together
  double round_ms = 0;       // one step of every worker
  // What bounds the round: "worker: compute and its link", "ps link", "ps
  // apply"; sync: "worker: compute and all-reduce" ("compute" alone with
  // one worker).
  std::string limit;
};

// Throws std::invalid_argument for zero workers, servers or variables, or
// a rate, step time or apply rate that is not positive.
ThroughputPrediction predict_throughput(const ThroughputInput& input);

// Bits per second of a tc-style rate ("100mbit", "1gbit", "2.5gbit",
// "500kbit"); throws std::invalid_argument naming the text otherwise.
double parse_link_rate(std::string_view text);

}  // namespace pstrain
