#pragma once
// The process log: every line goes to stderr and, once a run directory is
// known, to <run_dir>/<role><index>.log, prefixed with the wall time and the
// process's name ("ps0", "worker1"). Safe to call from any thread.
#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>

namespace pstrain {

// Names this process in log lines and appends them to `file` from now on
// (created with its directories; an empty path logs to stderr only).
void log_open(std::string name, const std::filesystem::path& file);
void log_line(std::string_view line);
// `line` as it is, without time or name, to stderr and the log file: a
// process's last words, in the fixed form tools and users match.
void log_plain(std::string_view line);

// log("pulled ", n, " chunks") — streams its arguments into one line.
template <class... Args>
void log(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  log_line(out.str());
}

}  // namespace pstrain
