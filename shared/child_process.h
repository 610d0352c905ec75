#pragma once
// Child processes and loopback ports for multi-process tests. Every child is
// ended by its PID when its handle goes out of scope, and dies with the test
// process (PR_SET_PDEATHSIG) even if the test crashes.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace pstrain::testing {

// A port that was free a moment ago on 127.0.0.1. Ports are handed out from
// the kernel's ephemeral range, so two calls rarely collide; tests take all
// their ports before starting anything.
inline std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("could not find a free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "pstrain-test-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

class Child {
 public:
  // Starts argv[0] with stdout and stderr appended to `log`.
  Child(std::vector<std::string> argv, const std::filesystem::path& log)
      : log_(log) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      redirect_and_die_with_parent(log);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  // Forks and runs `body` in the child (no exec), its return value the exit
  // code: for benchmarks that run a role in-process. Fork before creating
  // any ZeroMQ context or thread.
  template <class Body>
    requires std::is_invocable_r_v<int, Body>
  Child(const std::filesystem::path& log, Body body) : log_(log) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      redirect_and_die_with_parent(log);
      ::_exit(body());
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { stop(); }

  pid_t pid() const { return pid_; }

  // The exit code (128+signal when killed), or nullopt if still running
  // after `timeout`.
  std::optional<int> wait_for(std::chrono::duration<double> timeout) {
    if (status_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return status_;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void kill(int sig = SIGKILL) {
    if (!status_) ::kill(pid_, sig);
  }

  // SIGTERM, a grace period, then SIGKILL; always reaps.
  void stop() {
    if (pid_ <= 0 || status_) return;
    ::kill(pid_, SIGTERM);
    if (!wait_for(std::chrono::seconds(3))) {
      ::kill(pid_, SIGKILL);
      wait_for(std::chrono::seconds(10));
    }
  }

  std::string log_text() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  static void redirect_and_die_with_parent(const std::filesystem::path& log) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
  }

  pid_t pid_ = -1;
  std::filesystem::path log_;
  std::optional<int> status_;
};

}  // namespace pstrain::testing
