#pragma once
// The base of pstrain's own errors (ConfigError, PsError, ProtocolError,
// CommError, CudaError, ...): each names what went wrong in the system's
// terms (a config key, a ps, a message, a peer, a device), so a caller that
// catches pstrain::Error holds a message meant for the user, while
// std::invalid_argument and std::logic_error keep meaning a caller's
// mistake.
#include <stdexcept>

namespace pstrain {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace pstrain
