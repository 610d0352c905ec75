// The doctest runner of the unit-test executable; test cases live in the
// other files of this folder.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <csignal>

int main(int argc, char** argv) {
  // As in pstrain itself (app/pstrain.cc): Gloo's writes to a peer that went
  // away must fail with EPIPE, which the sync tests expect, not end the
  // process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  return doctest::Context(argc, argv).run();
}
