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

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, ReplySink& sink)
    : options_(std::move(options)),
      sink_(sink),
      workers_(options_.workers),
      worker_samples_(options_.workers, 0),
      worker_incarnations_(options_.workers, 0),
      worker_updates_(options_.workers, 0),
      updates_lost_(options_.workers, 0) {}

void Coordinator::add_handlers(Handlers& handlers) {
  handlers.on(Op::hello, [this](const Request& r) { hello(r); });
  handlers.on(Op::barrier, [this](const Request& r) { barrier(r); });
  handlers.on(Op::kv_set, [this](const Request& r) { kv_set(r); });
  handlers.on(Op::kv_get, [this](const Request& r) { kv_get(r); });
  handlers.on(Op::heartbeat, [this](const Request& r) { heartbeat(r); });
  handlers.on(Op::progress, [this](const Request& r) { progress(r); });
  handlers.on(Op::done, [this](const Request& r) { done(r); });
  handlers.on(Op::shutdown, [this](const Request& r) { shutdown(r); });
}

void Coordinator::hello(const Request& request) {
  const auto& h = request.header;
  const auto acked = wire::Hello::read(h).acked_updates;
  if (h.sender < options_.workers && h.incarnation != 0) {
    auto& counted = worker_updates_[h.sender];
    if (worker_incarnations_[h.sender] != h.incarnation) {
      // A new process of this worker: its count starts with it.
      worker_incarnations_[h.sender] = h.incarnation;
      counted = acked;
    } else if (acked > counted) {
      // The same process saw more acknowledged than this ps holds: a
      // restore of this ps went back past them.
      const auto lost = acked - counted;
      updates_lost_[h.sender] += lost;
      log(options_.name, ": the restore lost ", lost, " of worker ", h.sender,
          "'s acknowledged updates (it saw ", acked, ", the checkpoint held ", counted, ")");
      counted = acked;
    }
  }
  Reply reply{wire::reply_to(request.header), {}};
  wire::HelloReply{options_.workers, state_updates_}.write(reply.header);
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
  if (it == barriers_.end() && barriers_.size() >= kMaxBarriers)
    throw std::invalid_argument(std::to_string(barriers_.size()) +
                                " barriers are open, the limit; '" + entry.name +
                                "' is not opened");
  check_can_park(request.from);
  if (it == barriers_.end()) it = barriers_.emplace(entry.name, Barrier{entry.count, {}, {}}).first;
  it->second.senders.insert(request.header.sender);
  it->second.waiting.push_back({request.from, request.header});
  park(request.from);
  release_if_complete(it);
}

bool Coordinator::release_if_complete(std::map<std::string, Barrier, std::less<>>::iterator it) {
  auto& b = it->second;
  bool worker_entered = false, can_still_enter = false;
  std::string missing;  // workers that are absent or done and did not enter
  for (std::uint32_t w = 0; w < workers_.size(); ++w) {
    if (b.senders.contains(w)) {
      worker_entered = true;
    } else if (workers_[w].state == Liveness::pending || workers_[w].state == Liveness::live) {
      can_still_enter = true;
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(w);
    }
  }
  // Short of count only because workers were lost or finished: those who
  // can enter have.
  const bool short_handed = worker_entered && !missing.empty() && !can_still_enter;
  if (b.senders.size() < b.count && !short_handed) return false;
  if (b.senders.size() < b.count)
    log("barrier '", it->first, "' released with ", b.senders.size(), " of ", b.count,
        " senders: every live worker entered; absent or done: worker(s) ", missing);
  // Released together; the name can be entered afresh from now on.
  const auto released = std::move(b.waiting);
  barriers_.erase(it);
  for (const auto& p : released) {
    unpark(p.from);
    Reply reply{wire::reply_to(p.request), {}};
    wire::BarrierReply{released.size()}.write(reply.header);
    sink_.send(p.from, std::move(reply));
  }
  return true;
}

void Coordinator::kv_set(const Request& request) {
  const auto set = wire::KvSet::read(request.header);
  const auto value = request.payload_of(wire::DType::bytes);
  const auto it = kv_.find(set.key);
  if (it == kv_.end() && kv_.size() >= kMaxKvKeys)
    throw std::invalid_argument("the key-value store holds " + std::to_string(kv_.size()) +
                                " keys, its limit; '" + set.key + "' is not stored");
  const std::size_t replaced = it == kv_.end() ? 0 : it->second->size();
  if (kv_bytes_ - replaced + value.size() > kMaxKvBytes)
    throw std::invalid_argument("a value of " + std::to_string(value.size()) +
                                " bytes would take the key-value store past its limit of " +
                                std::to_string(kMaxKvBytes) + " bytes; '" + set.key +
                                "' is not stored");
  kv_bytes_ = kv_bytes_ - replaced + value.size();
  const auto stored = std::make_shared<const std::vector<std::uint8_t>>(value.begin(), value.end());
  kv_[set.key] = stored;
  sink_.send(request.from, {wire::reply_to(request.header), {}});
  const auto waiting = kv_waits_by_key_.find(set.key);
  if (waiting == kv_waits_by_key_.end()) return;
  const auto ids = waiting->second;  // take_kv_wait erases from it
  for (const auto id : ids) {
    const auto p = take_kv_wait(id);
    sink_.send(p.from, {wire::reply_to(p.request), stored});
  }
}

void Coordinator::kv_get(const Request& request) {
  const auto get = wire::KvGet::read(request.header);
  if (get.timeout_ms > kMaxKvGetTimeoutMs)
    throw std::invalid_argument("kv_get timeout of " + std::to_string(get.timeout_ms) +
                                " ms is more than the limit of " +
                                std::to_string(kMaxKvGetTimeoutMs) + " ms");
  if (const auto it = kv_.find(get.key); it != kv_.end())
    return sink_.send(request.from, {wire::reply_to(request.header), it->second});
  check_can_park(request.from);
  const auto id = next_kv_wait_++;
  const auto deadline = request.received + std::chrono::milliseconds(get.timeout_ms);
  kv_waits_.emplace(id, KvWait{{request.from, request.header, deadline}, get.key});
  kv_waits_by_key_[get.key].insert(id);
  kv_deadlines_.emplace(deadline, id);
  park(request.from);
}

Coordinator::Parked Coordinator::take_kv_wait(std::uint64_t id) {
  const auto it = kv_waits_.find(id);
  auto wait = std::move(it->second);
  kv_waits_.erase(it);
  kv_deadlines_.erase({wait.parked.deadline, id});
  const auto by_key = kv_waits_by_key_.find(wait.key);
  by_key->second.erase(id);
  if (by_key->second.empty()) kv_waits_by_key_.erase(by_key);
  unpark(wait.parked.from);
  return std::move(wait.parked);
}

void Coordinator::check_can_park(const Peer& peer) const {
  if (parked_ >= kMaxParked)
    throw std::invalid_argument(std::to_string(parked_) +
                                " requests are parked on this ps (barriers and kv_gets), the "
                                "limit; this one is not parked");
  const auto it = parked_by_peer_.find(peer);
  if (it != parked_by_peer_.end() && it->second >= kMaxParkedPerPeer)
    throw std::invalid_argument(std::to_string(it->second) +
                                " requests of this connection are parked (barriers and kv_gets), "
                                "the limit per peer; this one is not parked");
}

void Coordinator::park(const Peer& peer) {
  ++parked_by_peer_[peer];
  ++parked_;
}

void Coordinator::unpark(const Peer& peer) {
  const auto it = parked_by_peer_.find(peer);
  if (--it->second == 0) parked_by_peer_.erase(it);
  --parked_;
}

void Coordinator::check_worker(std::uint32_t sender, const char* op) const {
  // Only workers train samples and finish; tools and benchmarks use other ids.
  if (sender >= workers_.size())
    throw std::invalid_argument(std::string(op) + " from sender " + std::to_string(sender) +
                                ", which is not a worker (the cluster has " +
                                std::to_string(workers_.size()) + ")");
}

void Coordinator::heartbeat(const Request& request) {
  check_worker(request.header.sender, "heartbeat");
  Reply reply{wire::reply_to(request.header), {}};
  wire::GlobalSamples{global_samples_, worker_samples_[request.header.sender]}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void Coordinator::progress(const Request& request) {
  check_worker(request.header.sender, "progress");
  const auto report = wire::Progress::read(request.header);
  // A count that would wrap the total is not one a worker can have trained.
  if (report.samples > UINT64_MAX - global_samples_)
    throw std::invalid_argument("progress count " + std::to_string(report.samples) +
                                " overflows the global sample count");
  global_samples_ += report.samples;
  worker_samples_[request.header.sender] += report.samples;
  if (report.finished_pushing) workers_[request.header.sender].finished_pushing = true;
  Reply reply{wire::reply_to(request.header), {}};
  wire::GlobalSamples{global_samples_, worker_samples_[request.header.sender]}.write(reply.header);
  sink_.send(request.from, std::move(reply));
}

void Coordinator::done(const Request& request) {
  const auto sender = request.header.sender;
  check_worker(sender, "done");
  const auto total = wire::Done::read(request.header).total_samples;
  if (workers_[sender].state != Liveness::done)
    log("worker ", sender, " done after ", total, " samples");
  workers_[sender].state = Liveness::done;
  worker_samples_[sender] = std::max(worker_samples_[sender], total);
  Reply reply{wire::reply_to(request.header), {}};
  wire::GlobalSamples{global_samples_, worker_samples_[sender]}.write(reply.header);
  sink_.send(request.from, std::move(reply));
  // It cannot enter a barrier any more.
  release_complete_barriers();
  check_exit();
}

void Coordinator::shutdown(const Request& request) {
  log("shutdown requested by sender ", request.header.sender);
  exit_code_ = 0;
  sink_.send(request.from, {wire::reply_to(request.header), {}});
}

void Coordinator::start(Clock::time_point now) { started_ = now; }

bool Coordinator::admit(const Request& request) {
  const auto& h = request.header;
  if (h.sender < workers_.size() && h.incarnation != 0 &&
      workers_[h.sender].incarnation != h.incarnation) {
    auto& w = workers_[h.sender];
    const std::string index = "worker index " + std::to_string(h.sender);
    if (std::ranges::find(w.replaced, h.incarnation) != w.replaced.end()) {
      refuse(request, w,
             index + ": this process (incarnation " + hex(h.incarnation) +
                 ") was replaced by a newer one (incarnation " + hex(w.incarnation) +
                 "); its requests are refused",
             std::chrono::milliseconds(0));
      return false;
    }
    const std::chrono::duration<double> silent = request.received - w.last;
    if (w.incarnation != 0 && w.state == Liveness::live && silent < options_.takeover_silence) {
      const auto retry =
          std::chrono::ceil<std::chrono::milliseconds>(options_.takeover_silence - silent);
      refuse(request, w,
             index + " is taken by a live process (incarnation " + hex(w.incarnation) + ", heard " +
                 seconds_text(silent.count(), "%.1f") +
                 " s ago); a restart is accepted once the old process has been silent for " +
                 seconds_text(options_.takeover_silence.count(), "%.1f") +
                 " s (three liveness heartbeat intervals)",
             retry);
      return false;
    }
    if (w.incarnation != 0) {
      // A worker that said done has trained its share: a process taking its
      // index resumes at the end (a scheduler's restart after success).
      log(options_.name, ": ", index, " taken over by a new process (incarnation ",
          hex(h.incarnation), ") from incarnation ", hex(w.incarnation),
          w.state == Liveness::done
              ? std::string(", which had finished")
              : ", silent for " + seconds_text(silent.count(), "%.1f") + " s: a restart");
      w.replaced.push_back(w.incarnation);
      if (w.replaced.size() > kReplacedKept) w.replaced.erase(w.replaced.begin());
    }
    w.incarnation = h.incarnation;
    w.finished_pushing = false;
  }
  heard(h.sender, request.received);
  return true;
}

void Coordinator::refuse(const Request& request, Worker& w, const std::string& why,
                         std::chrono::milliseconds retry_after) {
  if (w.last_refused != request.header.incarnation) {
    log(options_.name, ": refused ", wire::to_string(request.header.op), ": ", why);
    w.last_refused = request.header.incarnation;
  }
  Reply reply{wire::error_reply(request.header, options_.name + ": " + why), {}};
  wire::ErrorReply{reply.header.text, static_cast<std::uint64_t>(retry_after.count())}.write(
      reply.header);
  sink_.send(request.from, std::move(reply));
}

void Coordinator::heard(std::uint32_t sender, Clock::time_point at) {
  if (sender >= workers_.size()) return;  // tools and benchmarks are not workers
  auto& w = workers_[sender];
  if (w.state == Liveness::done) return;
  if (w.state == Liveness::absent) log("worker ", sender, " is back; it is live again");
  w.state = Liveness::live;
  w.last = at;
}

void Coordinator::tick(Clock::time_point now) {
  expire_kv_gets(now);
  check_worker_timeout(now);
}

void Coordinator::fail(const Parked& parked, const std::string& why) {
  sink_.send(parked.from, {wire::error_reply(parked.request, options_.name + ": " + why), {}});
}

void Coordinator::expire_kv_gets(Clock::time_point now) {
  while (!kv_deadlines_.empty() && kv_deadlines_.begin()->first <= now) {
    const auto p = take_kv_wait(kv_deadlines_.begin()->second);
    const auto get = wire::KvGet::read(p.request);
    fail(p, "kv_get '" + get.key + "': not set within " +
                seconds_text(static_cast<double>(get.timeout_ms) / 1000, "%g") + " s");
  }
}

void Coordinator::check_worker_timeout(Clock::time_point now) {
  if (!started_ || exit_code_) return;
  std::string silent;
  std::vector<std::uint32_t> lost;
  for (std::uint32_t w = 0; w < workers_.size(); ++w) {
    const auto& worker = workers_[w];
    if (worker.state == Liveness::absent || worker.state == Liveness::done) continue;
    const auto last = worker.state == Liveness::pending ? *started_ : worker.last;
    if (now - last < options_.worker_timeout) continue;
    silent += (silent.empty() ? "" : ", ") + std::to_string(w);
    lost.push_back(w);
  }
  if (silent.empty()) return;
  const std::string reason = "no message from worker(s) " + silent + " for " +
                             seconds_text(options_.worker_timeout.count(), "%.1f") +
                             " s (net.worker_timeout)";
  if (options_.on_worker_loss == WorkerLoss::fail) {
    log(reason, "; exiting (train.on_worker_loss: fail)");
    fail_all_parked(reason);
    exit_code_ = 3;
    return;
  }
  for (const auto w : lost) workers_[w].state = Liveness::absent;
  log(reason, "; marked absent, going on without them (train.on_worker_loss: continue)");
  release_complete_barriers();
  check_exit();
}

void Coordinator::release_complete_barriers() {
  for (auto it = barriers_.begin(); it != barriers_.end();)
    it = release_if_complete(it) ? barriers_.begin() : std::next(it);
}

void Coordinator::check_exit() {
  if (exit_code_) return;
  bool done = false;
  for (const auto& w : workers_) {
    if (w.state == Liveness::pending || w.state == Liveness::live) return;
    done = done || w.state == Liveness::done;
  }
  const auto absent = workers_in(Liveness::absent);
  if (!done) {
    const std::string reason = "every worker is lost: worker(s) " + absent + " absent";
    log(reason, "; exiting");
    fail_all_parked(reason);
    exit_code_ = 3;
  } else if (absent.empty()) {
    log("all ", workers_.size(), " workers done; exiting");
    exit_code_ = 0;
  } else {
    log("every live worker done (", workers_in(Liveness::done), "), worker(s) ", absent,
        " absent; exiting");
    exit_code_ = 0;
  }
}

void Coordinator::fail_all_parked(const std::string& reason) {
  // Workers parked in a barrier or kv_get learn why instead of timing out.
  for (const auto& [name, b] : barriers_)
    for (const auto& p : b.waiting) fail(p, reason);
  for (const auto& [id, wait] : kv_waits_) fail(wait.parked, reason);
  barriers_.clear();
  kv_waits_.clear();
  kv_waits_by_key_.clear();
  kv_deadlines_.clear();
  parked_by_peer_.clear();
  parked_ = 0;
}

std::string Coordinator::workers_in(Liveness state) const {
  std::string out;
  for (std::size_t w = 0; w < workers_.size(); ++w)
    if (workers_[w].state == state) out += (out.empty() ? "" : ", ") + std::to_string(w);
  return out;
}

std::optional<Clock::time_point> Coordinator::next_deadline() const {
  if (kv_deadlines_.empty()) return std::nullopt;
  return kv_deadlines_.begin()->first;
}

void Coordinator::fill_progress(SnapshotInfo& info) const {
  info.global_samples = global_samples_;
  info.worker_samples = worker_samples_;
  info.worker_incarnations = worker_incarnations_;
  info.worker_updates = worker_updates_;
}

void Coordinator::restore_progress(const SnapshotInfo& info, std::uint64_t state_updates) {
  global_samples_ = info.global_samples;
  state_updates_ = state_updates;
  const auto workers = worker_samples_.size();
  // An end-of-run snapshot seeds a new run, whose workers start their
  // shards afresh; a checkpoint resumes its own run, where they go on.
  if (info.kind != SnapshotKind::checkpoint || info.worker_samples.size() != workers) return;
  worker_samples_ = info.worker_samples;
  // Format 1 files and snapshots of older builds have no update counts.
  if (info.worker_incarnations.size() == workers && info.worker_updates.size() == workers) {
    worker_incarnations_ = info.worker_incarnations;
    worker_updates_ = info.worker_updates;
  }
}

void Coordinator::adopt_shard(std::uint64_t state_updates) {
  state_updates_ = state_updates;
  std::ranges::fill(worker_incarnations_, 0);
  std::ranges::fill(worker_updates_, 0);
}

void Coordinator::applied_update(const wire::Header& request) {
  ++state_updates_;
  const auto w = request.sender;
  if (w >= worker_updates_.size() || request.incarnation == 0) return;
  // A process whose hello this ps has not seen (this ps restarted since):
  // its count starts here, and its next hello settles what was lost.
  if (worker_incarnations_[w] != request.incarnation) return;
  ++worker_updates_[w];
}

Coordinator::Figures Coordinator::figures() const {
  Figures f;
  f.global_samples = global_samples_;
  for (const auto& [name, b] : barriers_) f.parked_barrier += b.waiting.size();
  f.parked_kv_get = kv_waits_.size();
  f.updates_lost = updates_lost_;
  for (const auto& w : workers_) {
    static constexpr const char* kNames[] = {"pending", "live", "absent", "done"};
    // A worker lost before its first message was never heard (last unset).
    f.workers.push_back({kNames[static_cast<int>(w.state)],
                         w.last == Clock::time_point{} ? std::nullopt : std::optional(w.last)});
  }
  return f;
}

bool Coordinator::absent(std::uint32_t worker) const {
  return worker < workers_.size() && workers_[worker].state == Liveness::absent;
}

std::size_t Coordinator::workers_training() const {
  std::size_t n = 0;
  for (const auto& w : workers_)
    n += (w.state == Liveness::pending || w.state == Liveness::live) && !w.finished_pushing;
  return n;
}

}  // namespace pstrain::ps
