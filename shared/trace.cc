#include "shared/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "shared/atomic_file.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/thread_annotations.h"

namespace pstrain {
namespace {

struct Event {
  std::string name;
  const char* category;
  double ts_us;
  double dur_us;
  long tid;
  std::string args;  // JSON members, or empty
};

struct Recorder {
  std::atomic<bool> open{false};
  std::atomic<bool> recording{false};
  // The list is at max_events: later events are only counted (no string
  // is built for them).
  std::atomic<bool> full{false};
  Mutex mutex;
  std::vector<Event> events GUARDED_BY(mutex);
  std::size_t max_events GUARDED_BY(mutex) = 0;
  std::size_t dropped GUARDED_BY(mutex) = 0;
  std::string process GUARDED_BY(mutex);
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

double micros(trace::Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

long this_thread_id() {
  thread_local const long id = static_cast<long>(::syscall(SYS_gettid));
  return id;
}

}  // namespace

namespace trace {

bool on() { return recorder().recording.load(std::memory_order_relaxed); }

void pause(bool paused) {
  auto& r = recorder();
  r.recording.store(r.open.load() && !paused);
}

void complete(std::string_view name, const char* category, Clock::time_point begin,
              Clock::time_point end, std::string_view detail, std::string args) {
  auto& r = recorder();
  if (r.full.load(std::memory_order_relaxed)) {
    const MutexLock lock(r.mutex);
    ++r.dropped;
    return;
  }
  Event e{std::string(name),           category,         micros(begin),
          micros(end) - micros(begin), this_thread_id(), std::move(args)};
  if (!detail.empty()) e.name.append(" ").append(detail);
  const MutexLock lock(r.mutex);
  if (!r.open.load()) return;
  if (r.events.size() >= r.max_events) {
    r.full.store(true, std::memory_order_relaxed);
    ++r.dropped;
    return;
  }
  r.events.push_back(std::move(e));
}

}  // namespace trace

TraceSession::TraceSession(std::filesystem::path path, std::string process_name,
                           std::size_t max_events)
    : path_(std::move(path)) {
  const auto folder = std::filesystem::absolute(path_).parent_path();
  if (!std::filesystem::is_directory(folder))
    throw std::runtime_error("--trace " + path_.string() + ": no folder " + folder.string());
  auto& r = recorder();
  const MutexLock lock(r.mutex);
  if (r.open.exchange(true)) throw std::runtime_error("a trace session is open already");
  r.events.clear();
  r.events.reserve(std::min<std::size_t>(max_events, 1 << 16));
  r.max_events = max_events;
  r.dropped = 0;
  r.full.store(false);
  r.process = std::move(process_name);
  r.recording.store(true);
}

std::string TraceSession::json() {
  auto& r = recorder();
  const MutexLock lock(r.mutex);
  const long pid = static_cast<long>(::getpid());
  std::string out =
      "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":" + std::to_string(r.dropped) +
      "},\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
         ",\"tid\":0,\"args\":{\"name\":\"" + json_escape(r.process) + "\"}}";
  char number[64];
  for (const auto& e : r.events) {
    out += ",\n{\"name\":\"" + json_escape(e.name) + "\",\"cat\":\"" + e.category +
           "\",\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(e.tid);
    std::snprintf(number, sizeof number, ",\"ts\":%.3f,\"dur\":%.3f", e.ts_us, e.dur_us);
    out += number;
    if (!e.args.empty()) out += ",\"args\":{" + e.args + "}";
    out += "}";
  }
  out += "\n]}\n";
  return out;
}

TraceSession::~TraceSession() {
  auto& r = recorder();
  r.recording.store(false);
  std::string text;
  try {
    text = json();
    write_file_atomically(path_, text);
    log("trace: wrote ", path_.string());
  } catch (const std::exception& e) {
    log("trace: could not write ", path_.string(), ": ", e.what());
  }
  const MutexLock lock(r.mutex);
  r.events.clear();
  r.events.shrink_to_fit();
  r.open.store(false);
}

}  // namespace pstrain
