#pragma once
// What this build of pstrain is, for `pstrain --version` and the first line
// of every process's log: the version, written at build time
// (cmake/write_version.cmake: `git describe` in a checkout, else the
// project() version), and what the build holds.
#include <string>

namespace pstrain {

// "0.1.0" (a source tarball), "0.1.0-g24ea120-dirty" (a checkout with no
// release tag yet), "0.2.0-3-g1a2b3c4" (three commits after tag v0.2.0).
const char* build_version();

// The lines `pstrain --version` prints after the version, one per line: the
// wire protocol, the build type and compiler, CUDA (the architectures
// libpstrain_cuda.so was built for, and whether it loads on this host),
// cuDNN, and CURVE (whether the libzmq in use can encrypt).
std::string build_description();

}  // namespace pstrain
