#pragma once
// CURVE keys of a cluster (security.curve: true): who each key belongs to,
// `pstrain keygen`'s files, and what a process loads.
//
// One key pair per identity: every ps ("ps:N"), every worker ("worker:N")
// and one "tool" (tests, benchmarks, an operator's snapshot or shutdown).
// The identity's name is what a ps's ZAP handler returns as the connection's
// User-Id (server/zap_handler.h) and what its rights are looked up by
// (server/rights.h). A directory made by write_cluster_keys holds:
//
//   ps-0.key, worker-1.key, tool.key, ...   the secret key, Z85, one line (mode 0600)
//   public_keys                             "<identity> <public key Z85>" per line
//
// A process loads only its own secret key and the public list; its public
// key is derived from the secret one. Where a process looks: $PSTRAIN_KEYS
// when set (tools/launch hands each process a directory of its own that way),
// else the config's security.keys.
//
// Errors (CurveKeyError) name the file and what is wrong with it.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "shared/error.h"

namespace pstrain {

struct ClusterConfig;

struct CurveKeyError : pstrain::Error {
  using pstrain::Error::Error;
};

struct Identity {
  enum class Role { ps, worker, tool };
  Role role = Role::tool;
  std::uint32_t index = 0;  // ps and worker only

  std::string name() const;       // "ps:0", "worker:1", "tool": the User-Id
  std::string file_stem() const;  // "ps-0", "worker-1", "tool"
  // The identity a User-Id names; nullopt for anything else.
  static std::optional<Identity> parse(std::string_view name);
  bool operator==(const Identity&) const = default;
};

// The identity a PsClient of `sender` speaks as: worker N for a worker
// index, the tool for any other sender (tools use ids past the workers).
Identity client_identity(const ClusterConfig& config, std::uint32_t sender);

// Z85 text, 40 characters each.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

struct PublicKey {
  Identity who;
  std::string key;  // Z85
};

inline constexpr const char* kPublicKeysFile = "public_keys";

// Writes a fresh key pair for ps 0..ps-1, worker 0..workers-1 and the tool
// into `dir` (created with mode 0700 if absent), and the public list. Secret
// files are created with mode 0600; an existing file is never overwritten
// (CurveKeyError naming it).
void write_cluster_keys(const std::filesystem::path& dir, std::uint32_t ps, std::uint32_t workers);

// The public list in `dir`; every line checked (identity, key length, Z85).
std::vector<PublicKey> read_public_keys(const std::filesystem::path& dir);
// `who`'s key pair from its secret file in `dir`. The file must be readable
// by its owner only (like ssh's keys): a key others can read is refused.
CurveKeyPair read_key_pair(const std::filesystem::path& dir, const Identity& who);

// Where this process finds its keys: $PSTRAIN_KEYS, else security.keys.
std::filesystem::path keys_dir(const ClusterConfig& config);

// The public key the list gives for `who`; throws CurveKeyError naming the
// list's file when it has none.
std::string public_key_of(const std::vector<PublicKey>& list, const Identity& who,
                          const std::filesystem::path& dir);

}  // namespace pstrain
