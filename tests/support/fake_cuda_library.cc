// A stand-in for libpstrain_cuda.so built from other interface headers: it
// reports this build's ABI version, so only the interface hash can tell it
// apart (or, with PSTRAIN_FAKE_NO_HASH, it predates the hash). For the
// loader's checks (tests/unit/test_cuda_library.cc).
#include "client/compute/cuda_api.h"

extern "C" {
__attribute__((visibility("default"))) int pstrain_cuda_abi_version() {
  return PSTRAIN_CUDA_ABI_VERSION;
}
#ifndef PSTRAIN_FAKE_NO_HASH
__attribute__((visibility("default"))) const char* pstrain_cuda_abi_hash() {
  return "0123456789abcdef";
}
#endif
}
