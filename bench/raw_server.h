#pragma once
// The raw ZeroMQ peer of the ps benchmarks (bench_ps, bench_embeddings): a
// ROUTER on 127.0.0.1:`port` that answers [u64 reply size][frames...] with
// one frame of that size (at most `max_reply` bytes), sent zero-copy from a
// static buffer, as the ps sends its values. Runs until the process ends.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace pstrain::bench {

[[noreturn]] inline void raw_server(std::uint16_t port, std::size_t max_reply) {
  static std::vector<char> data(max_reply);
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
  s.bind("tcp://127.0.0.1:" + std::to_string(port));
  std::vector<zmq::message_t> frames;
  while (true) {
    frames.clear();
    if (!zmq::recv_multipart(s, std::back_inserter(frames))) continue;
    std::uint64_t reply = 0;
    std::memcpy(&reply, frames[1].data(), sizeof reply);
    s.send(frames[0], zmq::send_flags::sndmore);
    s.send(zmq::message_t(data.data(), reply, [](void*, void*) {}), zmq::send_flags::none);
  }
}

}  // namespace pstrain::bench
