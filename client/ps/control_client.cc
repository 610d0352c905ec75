#include "client/ps/control_client.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "shared/log.h"
#include "shared/messages.h"

namespace pstrain {

using wire::Header;
using wire::Op;

PsControlClient::PsControlClient(PsChannel& channel) : channel_(channel) {}

std::vector<std::uint64_t> PsControlClient::hello() {
  std::vector<std::uint64_t> updates(channel_.servers());
  for (std::uint32_t s = 0; s < updates.size(); ++s) updates[s] = hello(s);
  return updates;
}

std::uint64_t PsControlClient::hello(std::uint32_t server) {
  using Clock = PsChannel::Clock;
  const auto& options = channel_.options();
  std::optional<Clock::time_point> give_up;  // from the first temporary refusal
  // Replicated shards: a ps may have been failed over before this process
  // started, and its backup then answers for it (only then). Each asked in
  // turn for backup_silence (twice the fail-over wait), for timeout_s in all.
  const bool failover = options.failover_after_s > 0;
  const double attempt_s =
      failover ? std::min(options.timeout_s, 2 * options.failover_after_s) : options.timeout_s;
  const auto silent_until = Clock::now() + PsChannel::seconds(options.timeout_s);
  while (true) {
    Header h;
    wire::Hello{options.config_yaml, channel_.acked_updates(server)}.write(h);
    try {
      const auto replies = channel_.call(Op::hello, {server}, std::move(h), attempt_s);
      return wire::HelloReply::read(replies.front().header).state_updates;
    } catch (const PsRetryLater& refused) {
      const auto now = Clock::now();
      if (!give_up) give_up = now + PsChannel::seconds(options.takeover_grace_s);
      if (now >= *give_up) throw;
      const auto until = std::min<Clock::time_point>(*give_up, now + refused.after);
      while (Clock::now() < until) channel_.poll(until - Clock::now());
    } catch (const PsSilent& e) {
      if (!failover || Clock::now() >= silent_until) throw;
      const bool to_backup = channel_.serving(server) == server;
      log("ps client: ", e.what(), "; asking ", to_backup ? "its backup" : "it again", " instead");
      channel_.route(server, to_backup);
    }
  }
}

std::uint64_t PsControlClient::acked_updates(std::uint32_t server) const {
  return channel_.acked_updates(server);
}

std::uint64_t PsControlClient::generation(std::uint32_t server) const {
  return channel_.generation(server);
}

bool PsControlClient::take_generation_change(std::uint32_t server) {
  return channel_.take_generation_change(server);
}

void PsControlClient::barrier(const std::string& name, std::uint32_t count,
                              const std::function<void(std::uint64_t)>& while_waiting) {
  Header h;
  h.op = Op::barrier;
  wire::Barrier{name, count}.write(h);
  const double timeout_s = channel_.options().timeout_s;
  // A barrier may wait far longer than any request timeout (the slowest
  // worker decides), so it has none of its own: while it waits, heartbeats
  // keep this worker alive in every ps's eyes, and a ps that stops answering
  // them ends the wait with an error naming it.
  const auto id = channel_.open(Op::barrier, name, timeout_s);
  channel_.send(id, 0, std::move(h), {});
  const auto interval = PsChannel::seconds(std::min(1.0, timeout_s / 4));
  while (!channel_.answered(id)) {
    channel_.poll(interval);
    if (channel_.answered(id)) break;
    const auto global = heartbeat();
    if (while_waiting) while_waiting(global);
  }
  channel_.wait(id);
}

std::uint64_t PsControlClient::heartbeat() {
  const auto replies =
      channel_.call(Op::heartbeat, channel_.all_servers(), {}, channel_.options().timeout_s);
  return wire::GlobalSamples::read(replies.front().header).global_samples;
}

std::pair<std::uint64_t, std::uint64_t> PsControlClient::progress(
    const std::vector<std::uint32_t>& servers, std::uint64_t samples, bool finished_pushing) {
  Header h;
  wire::Progress{samples, finished_pushing}.write(h);
  const auto replies =
      channel_.call(Op::progress, servers, std::move(h), channel_.options().timeout_s);
  const auto counted = wire::GlobalSamples::read(replies.front().header);
  return {counted.global_samples, counted.sender_samples};
}

std::uint64_t PsControlClient::report_progress(std::uint64_t samples_since_last,
                                               const std::vector<std::uint32_t>& servers) {
  return progress(servers, samples_since_last, false).first;
}

std::uint64_t PsControlClient::samples_counted() { return progress({0}, 0, false).second; }

void PsControlClient::finished_pushing() { progress(channel_.all_servers(), 0, true); }

void PsControlClient::done(std::uint64_t total_samples) {
  Header h;
  wire::Done{total_samples}.write(h);
  channel_.call(Op::done, channel_.all_servers(), std::move(h), channel_.options().timeout_s);
}

void PsControlClient::kv_set(const std::string& key, std::span<const std::uint8_t> value) {
  Header h;
  wire::KvSet{wire::kv_key(channel_.options().sender, key)}.write(h);
  h.dtype = wire::DType::bytes;
  channel_.call(Op::kv_set, {0}, std::move(h), channel_.options().timeout_s, value);
}

std::vector<std::uint8_t> PsControlClient::kv_get(std::uint32_t writer, const std::string& key,
                                                  double timeout_s) {
  if (!(timeout_s >= 0))
    throw std::invalid_argument("ps client: kv_get of '" + key + "': timeout of " +
                                std::to_string(timeout_s) + " s");
  // Whole milliseconds on the wire; a wait too long to count is the ps's to refuse.
  const double ms = std::round(timeout_s * 1000);
  Header h;
  wire::KvGet{wire::kv_key(writer, key), ms < 0x1p64 ? static_cast<std::uint64_t>(ms) : UINT64_MAX}
      .write(h);
  auto replies =
      channel_.call(Op::kv_get, {0}, std::move(h), timeout_s + channel_.options().timeout_s);
  return std::move(replies.front().bytes);
}

std::string PsControlClient::snapshot(std::uint32_t server) {
  const auto replies = channel_.call(Op::snapshot, {server}, {}, channel_.options().timeout_s);
  return wire::SnapshotReply::read(replies.front().header).path;
}

std::string PsControlClient::stats(std::uint32_t server) {
  const auto replies = channel_.call(Op::stats, {server}, {}, channel_.options().timeout_s);
  return wire::StatsReply::read(replies.front().header).json;
}

void PsControlClient::shutdown(std::uint32_t server) {
  channel_.call(Op::shutdown, {server}, {}, channel_.options().timeout_s);
}

}  // namespace pstrain
