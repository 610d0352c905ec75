#pragma once
// KvStore: a key-value store in which each client writes under its own
// namespace and reads any writer's keys, waiting for them. The all-reduce
// rendezvous (client/comm/rendezvous.h) works on one; PsControlClient keeps
// it on ps 0 (wire::kv_key), and tests can hand the rendezvous their own.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pstrain {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Sets `key` in this client's namespace.
  virtual void kv_set(const std::string& key, std::span<const std::uint8_t> value) = 0;
  // Waits up to `timeout_s` (>= 0, at most a day) for `key` as `writer` set
  // it; throws PsError when it is not set by then or the store does not
  // answer.
  virtual std::vector<std::uint8_t> kv_get(std::uint32_t writer, const std::string& key,
                                           double timeout_s) = 0;
  // Tells the store's hosts that this client lives, so a long wait reads as
  // waiting rather than gone; throws PsError when they do not answer.
  virtual void keep_alive() = 0;
};

}  // namespace pstrain
