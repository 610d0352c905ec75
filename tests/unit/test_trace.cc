// The trace recorder (shared/trace.h): spans become complete events of this
// thread with their nesting intact, nothing is recorded without a session
// or while paused, the event cap drops and counts, names are escaped, and
// the session writes the file when it ends.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shared/trace.h"
#include "tests/support/child_process.h"

using namespace pstrain;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_SUITE_BEGIN("trace");

TEST_CASE("trace: nothing is recorded without a session") {
  CHECK_FALSE(trace::on());
  { const TraceSpan span("lost", "test"); }
  trace::pause(false);  // no session: stays off
  CHECK_FALSE(trace::on());
  const TempDir dir;
  {
    const TraceSession session(dir.path() / "t.json", "unit");
    CHECK(trace::on());
  }
  CHECK(count(read(dir.path() / "t.json"), "\"ph\":\"X\"") == 0);
}

TEST_CASE("trace: spans nest, carry their detail, and the file is written at the end") {
  const TempDir dir;
  const auto path = dir.path() / "t.json";
  {
    const TraceSession session(path, "worker \"7\"");
    {
      const TraceSpan outer("step", "step", "12");
      const TraceSpan inner("forward", "compute", "dense0");
    }
    trace::pause(true);
    CHECK_FALSE(trace::on());
    { const TraceSpan skipped("paused", "test"); }
    trace::pause(false);
    { const TraceSpan quoted("a \"quoted\"\\name", "test"); }
    CHECK_FALSE(std::filesystem::exists(path));  // written when the session ends
  }
  const std::string text = read(path);
  CHECK(count(text, "\"ph\":\"X\"") == 3);
  CHECK(text.find("\"name\":\"step 12\"") != std::string::npos);
  CHECK(text.find("\"name\":\"forward dense0\"") != std::string::npos);
  CHECK(text.find("paused") == std::string::npos);
  CHECK(text.find("\"name\":\"a \\\"quoted\\\"\\\\name\"") != std::string::npos);
  CHECK(text.find("\"args\":{\"name\":\"worker \\\"7\\\"\"}") != std::string::npos);
  CHECK(text.find("\"dropped_events\":0") != std::string::npos);
  // The inner span was recorded first (it ended first) and lies within the outer.
  const auto ts = [&](const std::string& name) {
    const auto at = text.find("\"ts\":", text.find("\"name\":\"" + name + "\""));
    return std::stod(text.substr(at + 5));
  };
  const auto dur = [&](const std::string& name) {
    const auto at = text.find("\"dur\":", text.find("\"name\":\"" + name + "\""));
    return std::stod(text.substr(at + 6));
  };
  CHECK(ts("step 12") <= ts("forward dense0"));
  CHECK(ts("forward dense0") + dur("forward dense0") <= ts("step 12") + dur("step 12") + 0.001);
}

TEST_CASE("trace: threads record at once, each on its own track") {
  const TempDir dir;
  const auto path = dir.path() / "t.json";
  {
    const TraceSession session(path, "unit");
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([] {
        for (int i = 0; i < 500; ++i) const TraceSpan span("work", "test");
      });
  }
  const std::string text = read(path);
  CHECK(count(text, "\"ph\":\"X\"") == 2000);
  std::set<std::string> tids;
  for (auto at = text.find("\"tid\":"); at != std::string::npos; at = text.find("\"tid\":", at + 1))
    tids.insert(text.substr(at + 6, text.find_first_of(",}", at) - at - 6));
  CHECK(tids.size() == 5);  // the four threads and the process-name record's 0
}

TEST_CASE("trace: past max_events, events are counted as dropped, not stored") {
  const TempDir dir;
  const auto path = dir.path() / "t.json";
  {
    const TraceSession session(path, "unit", 5);
    for (int i = 0; i < 8; ++i) const TraceSpan span("e", "test");
  }
  const std::string text = read(path);
  CHECK(count(text, "\"ph\":\"X\"") == 5);
  CHECK(text.find("\"dropped_events\":3") != std::string::npos);
}

TEST_CASE("trace: one session at a time, and a missing folder is said at the start") {
  const TempDir dir;
  CHECK_THROWS_WITH_AS(TraceSession(dir.path() / "no" / "t.json", "unit"),
                       doctest::Contains("no folder"), std::runtime_error);
  const TraceSession session(dir.path() / "t.json", "unit");
  CHECK_THROWS_WITH_AS(TraceSession(dir.path() / "u.json", "unit"),
                       doctest::Contains("open already"), std::runtime_error);
}
