#include "client/comm/rendezvous.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <span>

#include "client/comm/communicator.h"
#include "client/ps/ps_options.h"

namespace pstrain {
namespace {

std::span<const std::uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string run_root(const ClusterConfig& config) {
  char run[24];
  std::snprintf(run, sizeof run, "%016llx", static_cast<unsigned long long>(config.run_id()));
  return "sync/" + std::string(run) + "/";
}

// The value of `key` if ps 0 holds it now. A ps that does not answer reads
// as a missing key here, so callers check that it answers first.
std::optional<std::string> peek(KvStore& store, std::uint32_t writer, const std::string& key) {
  try {
    const auto value = store.kv_get(writer, key, 0);
    return std::string(value.begin(), value.end());
  } catch (const PsError&) {
    return std::nullopt;
  }
}

std::uint64_t number(const std::string& key, const std::string& value) {
  std::uint64_t n = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (error != std::errc() || end != value.data() + value.size())
    throw CommError("sync rendezvous: '" + key + "' on ps 0 holds '" + value + "', not a number");
  return n;
}

// Waits for `key` on ps 0 until `deadline` and returns its value; `what` says
// what the key means ("worker 1 to join attempt 2") for the error. The wait
// goes in slices of net.heartbeat with a keep_alive() after each, so that
// no ps takes this worker for dead while it waits.
std::string wait_key(KvStore& store, const ClusterConfig& config, std::uint32_t writer,
                     const std::string& key, Clock::time_point deadline, const std::string& what) {
  const double slice = std::max(0.05, config.net.heartbeat);
  const std::string waiting = "sync rendezvous: waiting for " + what + " (key '" + key + "')";
  while (true) {
    const auto start = Clock::now();
    const double left = seconds(deadline - start);
    const double wait = std::clamp(left, 0.0, slice);
    std::string cause;
    try {
      const auto value = store.kv_get(writer, key, wait);
      return {value.begin(), value.end()};
    } catch (const PsError& e) {
      cause = e.what();
    }
    // An error before the wait was up is no timeout: ps 0 refused or gave up
    // (it exits once a worker was silent for net.worker_timeout), and says
    // why. (5 ms: the wire rounds the wait to whole milliseconds.)
    if (seconds(Clock::now() - start) < wait - 0.005) throw CommError(waiting + ": " + cause);
    if (left <= 0) {
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g s", config.net.worker_timeout);
      throw CommError(waiting + ": not there within " + limit + " (net.worker_timeout): " + cause);
    }
    try {
      store.keep_alive();
    } catch (const PsError& e) {
      throw CommError(waiting + ": " + e.what() + " (the last wait said: " + cause + ")");
    }
  }
}

}  // namespace

SyncAttempt join_sync_run(KvStore& store, const ClusterConfig& config, std::uint32_t index,
                          std::uint64_t failed) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(config.net.worker_timeout));
  const std::string root = run_root(config);
  // peek() takes a ps that does not answer for a missing key; this tells
  // the two apart first, at the cost of one request.
  try {
    store.keep_alive();
  } catch (const PsError& e) {
    throw CommError(std::string("sync rendezvous: joining an attempt: ") + e.what());
  }
  const auto newest = peek(store, 0, root + "attempt");
  const std::uint64_t latest = newest ? number(root + "attempt", *newest) : 0;
  SyncAttempt attempt;
  std::string step;
  if (index == 0) {
    attempt.number = latest + 1;
    step = peek(store, 0, root + "step").value_or("0");
    // "open" before "attempt": whoever reads the new number finds it open.
    store.kv_set(root + std::to_string(attempt.number) + "/open", bytes(step));
    store.kv_set(root + "attempt", bytes(std::to_string(attempt.number)));
  } else {
    if (failed > 0)
      attempt.number = failed + 1;
    else if (latest > 0 &&
             !peek(store, index,
                   root + std::to_string(latest) + "/member/" + std::to_string(index)))
      attempt.number = latest;
    else
      attempt.number = latest + 1;
    const std::string open = root + std::to_string(attempt.number) + "/open";
    step = wait_key(store, config, 0, open, deadline,
                    "worker 0 to open attempt " + std::to_string(attempt.number));
  }
  attempt.step = number(root + "step", step);
  attempt.prefix = root + std::to_string(attempt.number) + "/";
  store.kv_set(attempt.prefix + "member/" + std::to_string(index), bytes("1"));
  for (std::uint32_t w = 0; w < config.workers.size(); ++w)
    if (w != index)
      wait_key(
          store, config, w, attempt.prefix + "member/" + std::to_string(w), deadline,
          "worker " + std::to_string(w) + " to join attempt " + std::to_string(attempt.number));
  return attempt;
}

void record_sync_step(KvStore& store, const ClusterConfig& config, std::uint64_t step) {
  store.kv_set(run_root(config) + "step", bytes(std::to_string(step)));
}

cuda::NcclId share_nccl_id(KvStore& store, const std::string& prefix, std::uint32_t index,
                           double timeout_s) {
  const std::string key = prefix + "nccl-id";
  cuda::NcclId id{};
  if (index == 0) {
    id = cuda::nccl_unique_id();
    store.kv_set(key, id);
    return id;
  }
  std::vector<std::uint8_t> value;
  try {
    value = store.kv_get(0, key, timeout_s);
  } catch (const PsError& e) {
    throw CommError(std::string("NCCL id from worker 0: ") + e.what());
  }
  if (value.size() != id.size())
    throw CommError("NCCL id under '" + key + "' has " + std::to_string(value.size()) +
                    " bytes, expected " + std::to_string(id.size()));
  std::ranges::copy(value, id.begin());
  return id;
}

RendezvousStore::RendezvousStore(KvStore& store, std::string prefix,
                                 std::chrono::milliseconds timeout)
    : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

void RendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  store_.kv_set(prefix_ + key, {reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
}

std::uint32_t RendezvousStore::writer(const std::string& key) {
  // Gloo's keys are the rank that sets them ("1"), ours end with it
  // ("failed/1"); sync ranks are worker indices.
  const auto digits = key.find_last_not_of("0123456789") + 1;
  std::uint32_t rank = 0;
  const auto [end, ec] = std::from_chars(key.data() + digits, key.data() + key.size(), rank);
  if (digits == key.size() || ec != std::errc() || end != key.data() + key.size())
    throw CommError("sync rendezvous: store key '" + key +
                    "' does not end with the rank that writes it");
  return rank;
}

std::vector<char> RendezvousStore::get(const std::string& key) {
  const auto value = store_.kv_get(writer(key), prefix_ + key, seconds(timeout_));
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
    store_.kv_get(writer(key), prefix_ + key,
                  seconds(std::max(left, std::chrono::milliseconds(0))));
  }
}

}  // namespace pstrain
