#include "tests/support/child_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

namespace pstrain {

std::uint16_t free_port() {
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

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "pstrain-test-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

ChildProcess::ChildProcess(std::vector<std::string> argv, const std::filesystem::path& log,
                           const std::vector<std::string>& env)
    : log_(log) {
  // Built before the fork: the child of a threaded parent may only exec.
  std::vector<std::string> environment = env;
  const auto name = [](std::string_view entry) { return entry.substr(0, entry.find('=')); };
  for (char** entry = environ; *entry; ++entry) {
    const bool replaced = std::any_of(
        env.begin(), env.end(), [&](const std::string& e) { return name(e) == name(*entry); });
    if (!replaced) environment.emplace_back(*entry);
  }
  std::vector<char*> envp;
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    redirect_and_die_with_parent(log);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
}

std::optional<int> ChildProcess::wait_for(std::chrono::duration<double> timeout) {
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

void ChildProcess::kill(int sig) {
  if (!status_) ::kill(pid_, sig);
}

void ChildProcess::stop() {
  if (pid_ <= 0 || status_) return;
  ::kill(pid_, SIGTERM);
  if (!wait_for(std::chrono::seconds(3))) {
    ::kill(pid_, SIGKILL);
    wait_for(std::chrono::seconds(10));
  }
}

std::string ChildProcess::log_text() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void ChildProcess::redirect_and_die_with_parent(const std::filesystem::path& log) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
}

}  // namespace pstrain
