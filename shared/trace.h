#pragma once
// A timeline of what this process spends its time on, written as Chrome's
// trace-event JSON (chrome://tracing and ui.perfetto.dev open it): where a
// worker's step goes (forward and backward per layer, sending each
// gradient, waiting for the replies, copying them in) and how a ps serves a
// request (its time queued, the handler, within it the optimizer's apply).
//
//   TraceSession session(path, "worker 0");   // records until destroyed,
//                                              // then writes `path`
//   { TraceSpan span("forward", "compute"); ... }   // one complete event
//
// Nothing is recorded without a session, or while recording is paused
// (trace::pause: a worker records train.trace_steps steps only); a span
// then costs one relaxed atomic load. Spans on one thread nest by time, as
// the viewers stack them. Times are CLOCK_MONOTONIC microseconds, the same
// clock in every process of a host, so the files of a worker and its ps
// merge onto one timeline (tools/launch --trace does).
//
// Thread rules: any thread may record; events go into one mutex-guarded
// list of at most `max_events`, past which they are counted as dropped (the
// file says how many), so a long run's trace never grows without bound.
// One session at a time per process.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace pstrain {

namespace trace {

using Clock = std::chrono::steady_clock;

// Recording now: a session is open and not paused.
bool on();
// Stops or resumes recording within the session (no effect without one).
void pause(bool paused);
// Records one complete event from `begin` to `end` on this thread, named
// `name`, then `detail` after a space where not empty; `args`: the members
// of the event's args object, JSON already ("\"queued_ms\":0.25").
void complete(std::string_view name, const char* category, Clock::time_point begin,
              Clock::time_point end, std::string_view detail = {}, std::string args = {});

}  // namespace trace

class TraceSession {
 public:
  static constexpr std::size_t kDefaultMaxEvents = 1 << 20;
  // Throws std::runtime_error when a session is open already or `path`'s
  // folder does not exist (said before the run, not after it).
  TraceSession(std::filesystem::path path, std::string process_name,
               std::size_t max_events = kDefaultMaxEvents);
  // Writes the file (atomically: it appears whole or not at all); a failure
  // to write is logged, not thrown.
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // The file's JSON text of what was recorded so far.
  static std::string json();

 private:
  std::filesystem::path path_;
};

// One complete event from construction to destruction, where recording is
// on at construction. It keeps views of `name` and `detail` until it is
// destroyed: pass strings that outlive it (literals, the model's and the
// config's names), never temporaries.
class TraceSpan {
 public:
  TraceSpan(std::string_view name, const char* category, std::string_view detail = {},
            std::string args = {})
      : name_(name), category_(category), detail_(detail), args_(std::move(args)) {
    if (trace::on()) begin_ = trace::Clock::now();
  }
  ~TraceSpan() {
    if (begin_ != trace::Clock::time_point{})
      trace::complete(name_, category_, begin_, trace::Clock::now(), detail_, std::move(args_));
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  // Views: the caller's strings outlive the span (names are literals or
  // the model's and the config's strings).
  std::string_view name_;
  const char* category_;
  std::string_view detail_;
  std::string args_;
  trace::Clock::time_point begin_{};
};

}  // namespace pstrain
