#pragma once
// What programs that start local pstrain processes need (the multi-process
// tests and the benchmarks): child processes, a scratch directory, and free
// loopback ports. Every child is ended by its PID when its handle goes out of
// scope, and dies with its parent (PR_SET_PDEATHSIG) even if the parent
// crashes.
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace pstrain {

// A port that was free a moment ago on 127.0.0.1. Ports are handed out from
// the kernel's ephemeral range, so two calls rarely collide; callers take all
// their ports before starting anything.
std::uint16_t free_port();

// A fresh directory under the system's temporary directory, removed with
// everything in it when the handle goes out of scope.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

class ChildProcess {
 public:
  // Starts argv[0] with stdout and stderr appended to `log`, in this
  // process's environment with `env` ("NAME=VALUE", each replacing NAME) on top.
  ChildProcess(std::vector<std::string> argv, const std::filesystem::path& log,
               const std::vector<std::string>& env = {});
  // Forks and runs `body` in the child (no exec), its return value the exit
  // code: for benchmarks that run a role in-process. Fork before creating
  // any ZeroMQ context or thread.
  template <class Body>
  requires std::is_invocable_r_v<int, Body> ChildProcess(const std::filesystem::path& log,
                                                         Body body)
      : log_(log) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      redirect_and_die_with_parent(log);
      ::_exit(body());
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { stop(); }

  pid_t pid() const { return pid_; }

  // The exit code (128+signal when killed), or nullopt if still running
  // after `timeout`.
  std::optional<int> wait_for(std::chrono::duration<double> timeout);

  void kill(int sig = SIGKILL);

  // SIGTERM, a grace period, then SIGKILL; always reaps.
  void stop();

  std::string log_text() const;

 private:
  static void redirect_and_die_with_parent(const std::filesystem::path& log);

  pid_t pid_ = -1;
  std::filesystem::path log_;
  std::optional<int> status_;
};

}  // namespace pstrain
