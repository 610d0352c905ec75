#include "server/zap_handler.h"

#include <algorithm>
#include <zmq_addon.hpp>

#include "shared/log.h"

namespace pstrain::ps {
namespace {

constexpr auto kPollMs = 100;           // how often the thread looks at its stop token
constexpr std::size_t kMaxLogged = 64;  // refused keys logged by name; the count has the rest

}  // namespace

ZapHandler::ZapHandler(zmq::context_t& context, const std::vector<PublicKey>& allowed,
                       std::string name)
    : name_(std::move(name)), socket_(context, zmq::socket_type::rep) {
  for (const auto& key : allowed) identities_.emplace(key.key, key.who.name());
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::jthread([this](const std::stop_token& stop) { serve(stop); });
}

ZapHandler::~ZapHandler() {
  thread_.request_stop();
  thread_.join();
}

void ZapHandler::serve(const std::stop_token& stop) {
  std::vector<zmq::message_t> request;
  while (!stop.stop_requested()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, kPollMs) <= 0) continue;  // timeout, or EINTR: look again
    request.clear();
    try {
      if (!zmq::recv_multipart(socket_, std::back_inserter(request), zmq::recv_flags::dontwait))
        continue;
      answer(request);
    } catch (const zmq::error_t& e) {
      log(name_, ": ZAP handler: ", e.what());  // the handshake fails; the ps goes on
    }
  }
}

// RFC 27: version, request id, domain, address, routing id, mechanism, then
// the mechanism's credentials (CURVE: the client's 32-byte public key).
// The reply: version, request id, status code and text, user id, metadata.
void ZapHandler::answer(std::vector<zmq::message_t>& request) {
  const auto frame = [&](std::size_t i) {
    return i < request.size() ? request[i].to_string() : std::string();
  };
  std::string status = "400", text = "key not listed", user_id;
  const std::string address = frame(3);
  std::string key_z85;
  if (request.size() >= 7 && frame(5) == "CURVE" && request[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, request[6].data<std::uint8_t>(), 32);
    key_z85 = z85;
    if (const auto it = identities_.find(key_z85); it != identities_.end()) {
      status = "200";
      text = "OK";
      user_id = it->second;
    }
  } else {
    text = "not a CURVE handshake";
  }
  if (status != "200") {
    const bool known = std::find(logged_.begin(), logged_.end(), key_z85) != logged_.end();
    if (!known && logged_.size() < kMaxLogged) {
      logged_.push_back(key_z85);
      log(name_, ": refused a connection from ", address.empty() ? "?" : address, ": ",
          key_z85.empty() ? text : "CURVE key " + key_z85 + " is not in the public list");
    }
  }
  std::vector<zmq::message_t> reply;
  reply.emplace_back(std::string("1.0"));
  reply.emplace_back(frame(1));
  reply.emplace_back(status);
  reply.emplace_back(text);
  reply.emplace_back(user_id);
  reply.emplace_back();
  zmq::send_multipart(socket_, reply);
}

}  // namespace pstrain::ps
