#pragma once
// PsDataClient: a worker's data path to the parameter servers, in the
// spirit of ps-lite's KVWorker. Calls are by variable name; the client cuts
// them into chunks with the shard map and keeps requests to every ps in
// flight at once, on a PsChannel (client/ps/ps_channel.h: resends,
// deadlines, zero-copy frames, restarts).
//
//   auto t = ps.push_pull("dense0/w", grad, weights);
//   ps.wait(t);
//
// Buffers belong to the library from the call until wait() on its ticket
// returns: payloads are sent from them without copies (ZeroMQ zero-copy
// frames) and pulled values are written once into them.
//
// With net.compression, push and push_pull send each chunk's gradient plus
// what earlier pushes of the variable left unsent, compressed, and keep the
// new remainder for the next (shared/gradient_compression.h).
//
// Thread rules: the channel's (one thread).
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "client/ps/ps_channel.h"
#include "client/ps/received_values.h"
#include "shared/shard_map.h"

namespace pstrain {

class PsDataClient : private PsChannel::ReplyHandler {
 public:
  using Ticket = PsChannel::Ticket;

  // Throws std::invalid_argument when the map's servers are not the
  // channel's.
  PsDataClient(PsChannel& channel, ShardMap map);
  PsDataClient(const PsDataClient&) = delete;
  PsDataClient& operator=(const PsDataClient&) = delete;

  const ShardMap& map() const { return map_; }

  // Creates every chunk that does not exist yet from the counter-based
  // generator (seed, variable, element); waits.
  void init(std::uint64_t seed);
  Ticket pull(std::string_view variable, std::span<float> out);
  Ticket push(std::string_view variable, std::span<const float> grad);
  Ticket push_pull(std::string_view variable, std::span<const float> grad, std::span<float> out);
  // A push_pull for a caller that computes on `out` only later
  // (train.pipeline): the versions of the values it receives go into
  // `versions` (chunk_count(variable) of them) instead of becoming at once
  // the versions this client's pushes say they were computed on;
  // adopt_versions makes them so when the caller starts using `out`.
  // Empty `versions`: the push_pull above.
  Ticket push_pull(std::string_view variable, std::span<const float> grad, std::span<float> out,
                   std::span<std::uint64_t> versions);
  // The same, for a caller that reads the new values once, later
  // (train.pipeline): they stay in the messages they arrive in, kept by
  // `into` (its size, the variable's) until its release(), instead of
  // being copied on arrival (client/ps/received_values.h). `into` belongs
  // to the library until wait() on the ticket returns.
  Ticket push_pull(std::string_view variable, std::span<const float> grad, ReceivedValues& into,
                   std::span<std::uint64_t> versions);
  void adopt_versions(std::string_view variable, std::span<const std::uint64_t> versions);
  std::size_t chunk_count(std::string_view variable) const;
  Ticket assign(std::string_view variable, std::span<const float> values);
  // The worker's clock: the steps it completed before the one its next
  // pulls and pushes are for. Every data request carries it (with a push,
  // also the chunk version the gradient was computed on), which mode ssp's
  // servers hold pulls by (shared/messages.h, ChunkRequest). 0 until set.
  void set_clock(std::uint64_t steps_done) { clock_ = steps_done; }
  void wait(Ticket ticket);
  void wait_all();
  // Gives up on every call in flight without waiting for its replies
  // (PsChannel::abandon_all). The abandoned updates may or may not have been
  // applied; waiting for their tickets afterwards returns at once.
  void abandon_all();

  // Embedding tables (docs/embeddings.md). `keys`: rows of `table`
  // (unique_rows makes them from a batch's ids), sorted and unique; `out`
  // and `grads` hold keys.size() x dim floats, row by row. Each ps gets the
  // rows it holds (row_home), every ps at once, in requests of at most one
  // frame's worth; the ps refuses keys that are not sorted and unique.
  Ticket sparse_pull(std::string_view table, std::span<const std::uint64_t> keys,
                     std::span<float> out);
  Ticket sparse_push(std::string_view table, std::span<const std::uint64_t> keys,
                     std::span<const float> grads);
  Ticket sparse_push_pull(std::string_view table, std::span<const std::uint64_t> keys,
                          std::span<const float> grads, std::span<float> out);

  // Gradient payload bytes push and push_pull have sent (resends not
  // counted), and what they would have been in float32: the two differ by
  // net.wire_dtype's and net.compression's savings.
  struct PushVolume {
    std::uint64_t sent = 0;
    std::uint64_t float32 = 0;
  };
  PushVolume push_volume() const { return push_volume_; }

  // Staleness of the last push (push or push_pull) of `variable`: updates
  // other workers applied between this client's pull and its push, summed
  // over the variable's chunks and divided by their number.
  double last_staleness(std::string_view variable) const;

 private:
  // A sparse call's request to one ps: its keys, their gradients (in the
  // wire dtype), and each key's place in the caller's rows.
  struct SparsePart {
    std::vector<std::uint64_t> keys;
    std::vector<std::uint8_t> grads;
    std::vector<std::uint32_t> places;
  };
  // A data call's state beside its channel ticket.
  struct Call {
    std::uint32_t variable = 0;
    float* out = nullptr;                // where pulled values of the variable go
    ReceivedValues* received = nullptr;  // or where they are kept
    // Where their versions go (push_pull with versions), by the chunk's
    // place in the variable; null: into pulled_version_.
    std::uint64_t* versions = nullptr;
    // The versions each chunk's push said it was computed on, by the
    // chunk's place in the variable: its staleness is counted from these
    // (a pipelined caller may adopt newer ones before the reply comes).
    std::vector<std::uint64_t> basis;
    // A push's gradient rounded to the wire dtype, sent from here.
    std::vector<std::uint16_t> halves;
    // A push's chunks compressed (net.compression), by the chunk's place
    // in the variable, sent from here.
    std::vector<std::vector<std::uint8_t>> compressed;
    double staleness_sum = 0;
    std::size_t staleness_chunks = 0;
    std::uint32_t dim = 0;  // sparse calls: the table's
    std::vector<SparsePart> parts;
  };
  std::uint32_t variable_index(std::string_view name) const;
  // Throws std::invalid_argument unless `versions` is empty or has a slot
  // per chunk of `variable`.
  void check_version_slots(std::string_view variable,
                           std::span<const std::uint64_t> versions) const;
  Ticket chunk_op(wire::Op op, std::string_view name, std::span<const float> grad,
                  std::span<float> out, std::size_t given, std::span<std::uint64_t> versions = {},
                  ReceivedValues* received = nullptr);
  // net.compression: variable v's gradient plus what it carries, chunk by
  // chunk, into call.compressed; what is not sent is carried on.
  void compress_chunks(std::uint32_t v, std::span<const float> grad, Call& call);
  // The index in map_.all_chunks() of variable v's first chunk.
  std::size_t first_chunk(std::uint32_t v) const;
  Ticket sparse_op(wire::Op op, std::string_view table, std::span<const std::uint64_t> keys,
                   std::span<const float> grads, std::span<float> out);
  // A sparse part's reply: its rows into the caller's.
  void take_rows(Call& call, const SparsePart& part, const wire::Header& header,
                 std::span<const std::uint8_t> payload);
  // A chunk's reply; `cookie` is the chunk's index in map_.all_chunks(), or
  // for a sparse op the part's index in its call.
  void on_reply(Ticket ticket, std::uint64_t cookie, const wire::Header& header,
                std::span<const std::uint8_t> payload, zmq::message_t* message) override;

  PsChannel& channel_;
  ShardMap map_;
  wire::DType wire_dtype_;  // of pulls, pushes and their replies (net.wire_dtype)
  std::vector<std::uint64_t> pulled_version_;  // per chunk of map_.all_chunks()
  std::uint64_t clock_ = 0;
  std::vector<double> staleness_;  // per variable
  Compression compression_;
  PushVolume push_volume_;
  // net.compression's error feedback: per variable, what its pushes have
  // not sent yet (added to the next push's gradient); empty until pushed.
  std::vector<std::vector<float>> carried_;
  std::unordered_map<Ticket, Call> calls_;
};

}  // namespace pstrain
