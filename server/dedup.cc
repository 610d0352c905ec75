#include "server/dedup.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pstrain::ps {

using wire::Op;

Dedup::Dedup(std::size_t window, std::size_t clients) : window_(window), max_clients_(clients) {
  if (window == 0 || clients == 0)
    throw std::invalid_argument("dedup: window and clients must be > 0");
}

// A primary's step (mode backup) is recorded by its backup like an update:
// sent again when its answer is lost, it must not apply twice.
bool Dedup::recorded(Op op) { return op == Op::init || op == Op::step || wire::is_update(op); }

Dedup::Seen Dedup::find(const wire::Header& request) {
  if (request.incarnation == 0 || !recorded(request.op)) return {};
  const auto it = clients_.find(request.incarnation);
  if (it == clients_.end()) return {};
  auto& c = it->second;
  c.last_used = ++tick_;
  if (const auto a = c.applied.find(request.request_id); a != c.applied.end())
    return {Verdict::resent, a->second};
  if (request.request_id <= c.evicted_below) return {Verdict::too_old, 0};
  return {};
}

void Dedup::record(const wire::Header& request, std::uint64_t version) {
  if (request.incarnation == 0 || !recorded(request.op)) return;
  auto& c = client(request);
  c.applied[request.request_id] = version;
  if (c.applied.size() > window_) {
    const auto oldest = c.applied.begin();
    c.evicted_below = std::max(c.evicted_below, oldest->first);
    c.applied.erase(oldest);
  }
}

void Dedup::hello(const wire::Header& request) {
  if (request.incarnation == 0) return;
  std::erase_if(clients_, [&](const auto& entry) {
    return entry.second.sender == request.sender && entry.first != request.incarnation;
  });
}

std::size_t Dedup::entries() const {
  std::size_t n = 0;
  for (const auto& [incarnation, c] : clients_) n += c.applied.size();
  return n;
}

std::vector<Dedup::ClientRecord> Dedup::records() const {
  std::vector<ClientRecord> out;
  out.reserve(clients_.size());
  for (const auto& [incarnation, c] : clients_)
    out.push_back({incarnation, c.sender, c.evicted_below, {c.applied.begin(), c.applied.end()}});
  return out;
}

void Dedup::restore(const std::vector<ClientRecord>& records) {
  if (records.size() > max_clients_)
    throw std::invalid_argument("dedup: a record of " + std::to_string(records.size()) +
                                " clients, more than the " + std::to_string(max_clients_) +
                                " kept");
  std::unordered_map<std::uint64_t, Client> clients;
  for (const auto& r : records) {
    if (r.applied.size() > window_)
      throw std::invalid_argument("dedup: a client's record of " +
                                  std::to_string(r.applied.size()) + " requests, more than the " +
                                  std::to_string(window_) + " kept");
    Client& c = clients[r.incarnation];
    c.sender = r.sender;
    c.evicted_below = r.evicted_below;
    c.last_used = ++tick_;
    c.applied.insert(r.applied.begin(), r.applied.end());
  }
  clients_ = std::move(clients);
}

Dedup::Client& Dedup::client(const wire::Header& request) {
  auto it = clients_.find(request.incarnation);
  if (it == clients_.end()) {
    if (clients_.size() >= max_clients_)
      clients_.erase(std::ranges::min_element(
          clients_, {}, [](const auto& entry) { return entry.second.last_used; }));
    Client fresh;
    fresh.sender = request.sender;
    it = clients_.emplace(request.incarnation, std::move(fresh)).first;
  }
  it->second.last_used = ++tick_;
  return it->second;
}

}  // namespace pstrain::ps
