#pragma once
// A raw ZeroMQ DEALER to a running ps, for tests that speak the wire protocol
// themselves: malformed messages (test_ps_robustness) and pulls of single
// chunks by name and index (restored_mismatches below).
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "shared/config.h"
#include "shared/curve_keys.h"
#include "shared/messages.h"
#include "shared/snapshot.h"

namespace pstrain::testing {

struct RawReply {
  wire::Header header;
  std::vector<std::vector<std::uint8_t>> payload;  // the payload frames
};

class RawPeer {
 public:
  // `curve`: speak CURVE with this key pair to a ps whose public key is
  // `server_key` (security.curve).
  // `routing_id`: the identity the ps sees (none: ZeroMQ's own).
  explicit RawPeer(const std::string& address,
                   const std::optional<std::pair<CurveKeyPair, std::string>>& curve = {},
                   const std::string& routing_id = {})
      : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    if (!routing_id.empty()) socket_.set(zmq::sockopt::routing_id, routing_id);
    socket_.set(zmq::sockopt::rcvtimeo, 5000);
    if (curve) {
      socket_.set(zmq::sockopt::curve_serverkey, curve->second);
      socket_.set(zmq::sockopt::curve_publickey, curve->first.public_key);
      socket_.set(zmq::sockopt::curve_secretkey, curve->first.secret_key);
    }
    socket_.connect(address);
  }

  // Sends the frames as one message and returns the decoded reply, or
  // nullopt when none came within the receive timeout.
  std::optional<RawReply> exchange(const std::vector<std::vector<std::uint8_t>>& frames) {
    auto replies = exchange_all(frames);
    if (replies.empty()) return std::nullopt;
    return std::move(replies.front());
  }

  // Sends the frames as one message and returns every reply in the one
  // message that answers it (shared/protocol.h: each a header and the
  // payload frames it declares); empty when none came in time.
  std::vector<RawReply> exchange_all(const std::vector<std::vector<std::uint8_t>>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i)
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    std::vector<zmq::message_t> message;
    std::vector<RawReply> replies;
    if (!zmq::recv_multipart(socket_, std::back_inserter(message))) return replies;
    for (std::size_t i = 0; i < message.size();) {
      auto& reply = replies.emplace_back(
          wire::decode_header({message[i].data<std::uint8_t>(), message[i].size()}));
      for (++i; reply.payload.size() < reply.header.payload_frames && i < message.size(); ++i) {
        const auto* p = message[i].data<std::uint8_t>();
        reply.payload.emplace_back(p, p + message[i].size());
      }
    }
    return replies;
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
};

// Pulls from every ps of `config` each chunk its file in the snapshot folder
// `dir` holds, and compares values (bit for bit) and version with the file.
// Returns what differs; empty when the ps's hold exactly the snapshot.
inline std::string restored_mismatches(const ClusterConfig& config,
                                       const std::filesystem::path& dir) {
  std::string out;
  for (std::uint32_t s = 0; s < config.ps.size(); ++s) {
    const auto snap = read_snapshot(dir / ("ps" + std::to_string(s) + ".bin"));
    if (snap.records.empty()) out += "ps" + std::to_string(s) + ".bin holds no chunks; ";
    RawPeer peer(config.ps[s].connect_address());
    for (const auto& r : snap.records) {
      const std::string what =
          "ps " + std::to_string(s) + " '" + r.name + "' chunk " + std::to_string(r.chunk);
      wire::Header h;
      h.op = wire::Op::pull;
      h.request_id = 1;
      h.run_id = config.hash();
      wire::ChunkRequest{r.name, r.chunk}.write(h);
      const auto reply = peer.exchange({wire::encode_header(h)});
      if (!reply || reply->header.status != wire::Status::ok || reply->payload.size() != 1) {
        out += what + ": no values; ";
        continue;
      }
      const auto& bytes = reply->payload[0];
      if (bytes.size() != r.values.size() * sizeof(float) ||
          std::memcmp(bytes.data(), r.values.data(), bytes.size()) != 0)
        out += what + ": values differ; ";
      if (wire::ChunkReply::read(reply->header).version != r.version)
        out += what + ": version differs; ";
    }
  }
  return out;
}

}  // namespace pstrain::testing
