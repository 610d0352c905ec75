#include "client/sync/rendezvous.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <span>

#include "client/ps_client.h"
#include "client/sync/communicator.h"

namespace pstrain {
namespace {

std::span<const std::uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

double seconds(std::chrono::milliseconds ms) {
  return std::chrono::duration<double>(ms).count();
}

}  // namespace

std::string join_sync_run(PsClient& ps, const ClusterConfig& config, std::uint32_t index) {
  char run[24];
  std::snprintf(run, sizeof run, "%016llx", static_cast<unsigned long long>(config.hash()));
  const std::string root = "sync/" + std::string(run) + "/";
  const auto workers = static_cast<std::uint32_t>(config.workers.size());
  if (index == 0) {
    std::random_device random;
    const std::string attempt = std::to_string(random()) + "-" + std::to_string(random());
    ps.kv_set(root + "attempt", bytes(attempt));
  }
  try {
    ps.barrier(root + "join", workers);
  } catch (const PsError& e) {
    throw CommError("sync rendezvous: not all " + std::to_string(workers) +
                    " workers reached barrier '" + root + "join' on ps 0 (" + e.what() + ")");
  }
  const auto attempt = ps.kv_get(root + "attempt", config.net.request_timeout);
  return root + std::string(attempt.begin(), attempt.end()) + "/";
}

cuda::NcclId share_nccl_id(PsClient& ps, const std::string& prefix, std::uint32_t index,
                           double timeout_s) {
  const std::string key = prefix + "nccl-id";
  cuda::NcclId id{};
  if (index == 0) {
    id = cuda::nccl_unique_id();
    ps.kv_set(key, id);
    return id;
  }
  std::vector<std::uint8_t> value;
  try {
    value = ps.kv_get(key, timeout_s);
  } catch (const PsError& e) {
    throw CommError(std::string("NCCL id from worker 0: ") + e.what());
  }
  if (value.size() != id.size())
    throw CommError("NCCL id under '" + key + "' has " + std::to_string(value.size()) +
                    " bytes, expected " + std::to_string(id.size()));
  std::ranges::copy(value, id.begin());
  return id;
}

RendezvousStore::RendezvousStore(PsClient& ps, std::string prefix,
                                 std::chrono::milliseconds timeout)
    : ps_(ps), prefix_(std::move(prefix)), timeout_(timeout) {}

void RendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  ps_.kv_set(prefix_ + key, {reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
}

std::vector<char> RendezvousStore::get(const std::string& key) {
  const auto value = ps_.kv_get(prefix_ + key, seconds(timeout_));
  return {value.begin(), value.end()};
}

void RendezvousStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RendezvousStore::wait(const std::vector<std::string>& keys,
                   const std::chrono::milliseconds& timeout) {
  // One deadline for all keys: each kv_get gets what is left of it.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& key : keys) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    ps_.kv_get(prefix_ + key, seconds(std::max(left, std::chrono::milliseconds(0))));
  }
}

}  // namespace pstrain
