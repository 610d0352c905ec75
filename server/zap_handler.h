#pragma once
// The ps's ZAP handler (ZeroMQ's authentication protocol, RFC 27): with
// security.curve on, every CURVE handshake on the ps's socket is decided
// here. A client key in the public list is accepted and its connection gets
// the key's identity as User-Id ("worker:1", "ps:0", "tool"), which every
// message it sends carries as metadata (server/request_loop.h reads it); any
// other key is refused, so ZeroMQ drops the connection before a single
// message of it reaches the request loop and the peer gets no reply at all.
// The first refusal of each key (up to 64 keys) is logged with the peer's
// address.
//
//   zmq::context_t context;
//   ZapHandler zap(context, read_public_keys(dir), "ps 0");  // before bind
//
// Thread rules: the handler answers on a thread of its own, which alone uses
// its REP socket (bound to inproc://zeromq.zap.01 in the constructor, on the
// caller's thread, before the thread starts); the key table is not changed
// after construction. The destructor stops and joins the thread; destroy the
// handler before the context (declare it after).
#include <cstdint>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "shared/curve_keys.h"

namespace pstrain::ps {

class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, const std::vector<PublicKey>& allowed, std::string name);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

 private:
  void serve(const std::stop_token& stop);
  void answer(std::vector<zmq::message_t>& request);

  std::string name_;
  std::unordered_map<std::string, std::string> identities_;  // Z85 public key -> User-Id
  zmq::socket_t socket_;
  std::vector<std::string> logged_;  // keys whose refusal was logged (bounded)
  std::jthread thread_;              // last: started once the rest is ready
};

}  // namespace pstrain::ps
