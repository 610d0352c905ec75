#include "shared/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "shared/config.h"

namespace pstrain {
namespace {

constexpr std::size_t kZ85KeyChars = 40;  // a 32-byte key in Z85

std::string system_error(const std::filesystem::path& path, const char* what) {
  return path.string() + ": " + what + ": " + std::strerror(errno);
}

bool is_z85_key(std::string_view text) {
  if (text.size() != kZ85KeyChars) return false;
  std::string copy(text);
  std::uint8_t bytes[32];
  return zmq_z85_decode(bytes, copy.c_str()) != nullptr;
}

// Creates `path` with mode 0600 (no window in which others could open it)
// and writes `text`; refuses an existing file.
void write_secret(const std::filesystem::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw CurveKeyError(system_error(path, "cannot create the secret key file"));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool closed = ::close(fd) == 0;
  if (!ok || !closed) throw CurveKeyError(system_error(path, "cannot write the secret key"));
}

std::string read_text(const std::filesystem::path& path, const std::string& what) {
  std::ifstream in(path);
  if (!in)
    throw CurveKeyError(path.string() + ": cannot read " + what + " (security.curve is on; " +
                        "make the keys with `pstrain keygen`, or set $PSTRAIN_KEYS / " +
                        "security.keys to where they are)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string Identity::name() const {
  switch (role) {
    case Role::ps:
      return "ps:" + std::to_string(index);
    case Role::worker:
      return "worker:" + std::to_string(index);
    case Role::tool:
      break;
  }
  return "tool";
}

std::string Identity::file_stem() const {
  std::string stem = name();
  if (const auto colon = stem.find(':'); colon != std::string::npos) stem[colon] = '-';
  return stem;
}

std::optional<Identity> Identity::parse(std::string_view name) {
  if (name == "tool") return Identity{};
  const auto colon = name.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto role = name.substr(0, colon);
  const auto digits = name.substr(colon + 1);
  Identity id;
  if (role == "ps")
    id.role = Role::ps;
  else if (role == "worker")
    id.role = Role::worker;
  else
    return std::nullopt;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), id.index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size())
    return std::nullopt;
  return id;
}

Identity client_identity(const ClusterConfig& config, std::uint32_t sender) {
  if (sender < config.workers.size()) return {Identity::Role::worker, sender};
  return {};
}

void write_cluster_keys(const std::filesystem::path& dir, std::uint32_t ps, std::uint32_t workers) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw CurveKeyError(dir.string() + ": cannot create the directory: " + ec.message());
  // Only the owner may list it; the secret files are 0600 anyway.
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  std::vector<Identity> everyone;
  for (std::uint32_t i = 0; i < ps; ++i) everyone.push_back({Identity::Role::ps, i});
  for (std::uint32_t i = 0; i < workers; ++i) everyone.push_back({Identity::Role::worker, i});
  everyone.push_back({});
  std::string list = "# pstrain CURVE public keys: <identity> <Z85 public key>\n";
  for (const auto& who : everyone) {
    char public_key[kZ85KeyChars + 1], secret_key[kZ85KeyChars + 1];
    if (zmq_curve_keypair(public_key, secret_key) != 0)
      throw CurveKeyError(std::string("cannot make a CURVE key pair: ") +
                          zmq_strerror(zmq_errno()) + " (libzmq without libsodium?)");
    write_secret(dir / (who.file_stem() + ".key"), std::string(secret_key) + "\n");
    list += who.name() + " " + public_key + "\n";
  }
  const auto list_path = dir / kPublicKeysFile;
  std::ofstream out(list_path, std::ios::trunc);
  out << list;
  if (!out.flush()) throw CurveKeyError(list_path.string() + ": cannot write the public list");
}

std::vector<PublicKey> read_public_keys(const std::filesystem::path& dir) {
  const auto path = dir / kPublicKeysFile;
  std::istringstream text(read_text(path, "the list of public keys"));
  std::vector<PublicKey> out;
  std::string line;
  for (int number = 1; std::getline(text, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, key, extra;
    fields >> name >> key >> extra;
    const auto who = Identity::parse(name);
    const auto where = path.string() + " line " + std::to_string(number) + ": ";
    if (!who) throw CurveKeyError(where + "'" + name + "' is not ps:N, worker:N or tool");
    if (!is_z85_key(key) || !extra.empty())
      throw CurveKeyError(where + "expected '<identity> <40-character Z85 public key>'");
    for (const auto& p : out)
      if (p.who == *who || p.key == key)
        throw CurveKeyError(where + "'" + name + "' or its key is listed twice");
    out.push_back({*who, key});
  }
  return out;
}

CurveKeyPair read_key_pair(const std::filesystem::path& dir, const Identity& who) {
  const auto path = dir / (who.file_stem() + ".key");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    throw CurveKeyError(path.string() + ": the secret key is readable by others (mode " + mode +
                        "); it must be 0600");
  }
  auto text = read_text(path, "the secret key of " + who.name());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (!is_z85_key(text))
    throw CurveKeyError(path.string() + ": not a CURVE secret key (expected one line of 40 " +
                        "Z85 characters)");
  char public_key[kZ85KeyChars + 1];
  if (zmq_curve_public(public_key, text.c_str()) != 0)
    throw CurveKeyError(path.string() +
                        ": cannot derive the public key: " + zmq_strerror(zmq_errno()));
  return {public_key, text};
}

std::filesystem::path keys_dir(const ClusterConfig& config) {
  if (const char* env = std::getenv("PSTRAIN_KEYS"); env && *env) return env;
  return config.security.keys;
}

std::string public_key_of(const std::vector<PublicKey>& list, const Identity& who,
                          const std::filesystem::path& dir) {
  for (const auto& p : list)
    if (p.who == who) return p.key;
  throw CurveKeyError((dir / kPublicKeysFile).string() + ": no public key for " + who.name());
}

}  // namespace pstrain
