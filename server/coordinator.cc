#include "server/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "shared/log.h"
#include "shared/messages.h"

namespace pstrain::ps {

using wire::Op;

namespace {

std::string seconds_text(double seconds, const char* format) {
  char buf[32];
  std::snprintf(buf, sizeof buf, format, seconds);
  return buf;
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, ReplySink& sink)
    : options_(std::move(options)),
      sink_(sink),
      heard_(options_.workers),
      done_(options_.workers, false),
      worker_samples_(options_.workers, 0) {}

void Coordinator::add_handlers(Handlers& handlers) {
  handlers.on(Op::hello, [this](const Request& r) { hello(r); });
  handlers.on(Op::barrier, [this](const Request& r) { barrier(r); });
  handlers.on(Op::kv_set, [this](const Request& r) { kv_set(r); });
  handlers.on(Op::kv_get, [this](const Request& r) { kv_get(r); });
  handlers.on(Op::heartbeat, [this](const Request& r) { heartbeat(r); });
  handlers.on(Op::done, [this](const Request& r) { done(r); });
  handlers.on(Op::shutdown, [this](const Request& r) { shutdown(r); });
}

void Coordinator::hello(const Request& request) {
  Reply reply{wire::reply_to(request.header), {}};
  wire::HelloReply{options_.workers}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void Coordinator::barrier(const Request& request) {
  const auto entry = wire::Barrier::read(request.header);
  if (entry.count == 0) throw std::invalid_argument("barrier count must be at least 1");
  auto it = barriers_.find(entry.name);
  if (it != barriers_.end() && it->second.count != entry.count)
    throw std::invalid_argument("barrier '" + entry.name + "' was entered with count " +
                                std::to_string(it->second.count) + ", this request says " +
                                std::to_string(entry.count));
  if (it == barriers_.end()) it = barriers_.emplace(entry.name, Barrier{entry.count, {}, {}}).first;
  auto& b = it->second;
  b.senders.insert(request.header.sender);
  b.waiting.push_back({request.from, request.header});
  if (b.senders.size() < b.count) return;
  // Released together; the name can be entered afresh from now on.
  const auto released = std::move(b.waiting);
  barriers_.erase(it);
  for (const auto& p : released) {
    Reply reply{wire::reply_to(p.request), {}};
    wire::BarrierReply{released.size()}.write(reply.header);
    sink_.send(p.from, std::move(reply));
  }
}

void Coordinator::kv_set(const Request& request) {
  const auto set = wire::KvSet::read(request.header);
  const auto value = request.payload_of(wire::DType::bytes);
  kv_[set.key].assign(value.begin(), value.end());
  sink_.send(request.from, {wire::reply_to(request.header), {}});
  std::erase_if(kv_waiting_, [&](const Parked& p) {
    if (wire::KvGet::read(p.request).key != set.key) return false;
    send_value(p.from, p.request, set.key);
    return true;
  });
}

void Coordinator::kv_get(const Request& request) {
  const auto get = wire::KvGet::read(request.header);
  if (get.timeout_ms > kMaxKvGetTimeoutMs)
    throw std::invalid_argument("kv_get timeout of " + std::to_string(get.timeout_ms) +
                                " ms is more than the limit of " +
                                std::to_string(kMaxKvGetTimeoutMs) + " ms");
  if (kv_.contains(get.key)) return send_value(request.from, request.header, get.key);
  kv_waiting_.push_back(
      {request.from, request.header, request.received + std::chrono::milliseconds(get.timeout_ms)});
}

void Coordinator::send_value(const Peer& to, const wire::Header& request, const std::string& key) {
  sink_.send(to, {wire::reply_to(request), kv_.at(key)});
}

void Coordinator::check_worker(std::uint32_t sender, const char* op) const {
  // Only workers train samples and finish; tools and benchmarks use other ids.
  if (sender >= done_.size())
    throw std::invalid_argument(std::string(op) + " from sender " + std::to_string(sender) +
                                ", which is not a worker (the cluster has " +
                                std::to_string(done_.size()) + ")");
}

void Coordinator::heartbeat(const Request& request) {
  check_worker(request.header.sender, "heartbeat");
  const auto beat = wire::Heartbeat::read(request.header);
  // A count that would wrap the total is not one a worker can have trained.
  if (beat.samples > UINT64_MAX - global_samples_)
    throw std::invalid_argument("heartbeat count " + std::to_string(beat.samples) +
                                " overflows the global sample count");
  global_samples_ += beat.samples;
  worker_samples_[request.header.sender] += beat.samples;
  Reply reply{wire::reply_to(request.header), {}};
  wire::GlobalSamples{global_samples_}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void Coordinator::done(const Request& request) {
  const auto sender = request.header.sender;
  check_worker(sender, "done");
  const auto total = wire::Done::read(request.header).total_samples;
  if (!done_[sender]) log("worker ", sender, " done after ", total, " samples");
  done_[sender] = true;
  worker_samples_[sender] = std::max(worker_samples_[sender], total);
  if (std::ranges::all_of(done_, [](bool d) { return d; })) {
    log("all ", done_.size(), " workers done; exiting");
    exit_code_ = 0;
  }
  Reply reply{wire::reply_to(request.header), {}};
  wire::GlobalSamples{global_samples_}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void Coordinator::shutdown(const Request& request) {
  log("shutdown requested by sender ", request.header.sender);
  exit_code_ = 0;
  sink_.send(request.from, {wire::reply_to(request.header), {}});
}

void Coordinator::heard(std::uint32_t sender, Clock::time_point at) {
  if (sender >= heard_.size()) return;  // tools and benchmarks are not workers
  heard_[sender] = at;
  if (!first_heard_) first_heard_ = at;
}

void Coordinator::tick(Clock::time_point now) {
  expire_kv_gets(now);
  check_worker_timeout(now);
}

void Coordinator::fail(const Parked& parked, const std::string& why) {
  sink_.send(parked.from, {wire::error_reply(parked.request, options_.name + ": " + why), {}});
}

void Coordinator::expire_kv_gets(Clock::time_point now) {
  std::erase_if(kv_waiting_, [&](const Parked& p) {
    if (now < p.deadline) return false;
    const auto get = wire::KvGet::read(p.request);
    fail(p, "kv_get '" + get.key + "': not set within " +
                seconds_text(static_cast<double>(get.timeout_ms) / 1000, "%g") + " s");
    return true;
  });
}

void Coordinator::check_worker_timeout(Clock::time_point now) {
  if (!first_heard_ || exit_code_) return;
  std::string silent;
  for (std::size_t w = 0; w < heard_.size(); ++w) {
    if (done_[w]) continue;
    const auto last = heard_[w] ? *heard_[w] : *first_heard_;
    if (now - last >= options_.worker_timeout)
      silent += (silent.empty() ? "" : ", ") + std::to_string(w);
  }
  if (silent.empty()) return;
  const std::string reason = "no message from worker(s) " + silent + " for " +
                             seconds_text(options_.worker_timeout.count(), "%.1f") +
                             " s (net.worker_timeout)";
  log(reason, "; exiting");
  // Workers parked in a barrier or kv_get learn why instead of timing out.
  for (const auto& [name, b] : barriers_)
    for (const auto& p : b.waiting) fail(p, reason);
  for (const auto& p : kv_waiting_) fail(p, reason);
  barriers_.clear();
  kv_waiting_.clear();
  exit_code_ = 3;
}

std::optional<Clock::time_point> Coordinator::next_deadline() const {
  if (kv_waiting_.empty()) return std::nullopt;
  return std::ranges::min_element(kv_waiting_, {}, &Parked::deadline)->deadline;
}

void Coordinator::restore_samples(std::uint64_t global,
                                  const std::vector<std::uint64_t>& per_worker) {
  global_samples_ = global;
  if (per_worker.size() == worker_samples_.size()) worker_samples_ = per_worker;
}

Coordinator::Figures Coordinator::figures() const {
  Figures f;
  f.global_samples = global_samples_;
  for (const auto& [name, b] : barriers_) f.parked_barrier += b.waiting.size();
  f.parked_kv_get = kv_waiting_.size();
  return f;
}

}  // namespace pstrain::ps
