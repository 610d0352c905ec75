// Fuzz target: the wire decoder (shared/protocol.h) on a header frame and
// its payload frames (input format in fuzz_input.h). A frame that decodes
// must encode back to the same bytes, and every failure must be a
// ProtocolError; anything else (a crash, a sanitizer report, another
// exception) is a finding.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "shared/protocol.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pstrain;
  fuzz::Bytes in(data, size), header_frame;
  if (!fuzz::take_frame(in, header_frame)) return 0;
  wire::Header header;
  try {
    header = wire::decode_header(header_frame);
  } catch (const wire::ProtocolError&) {
    return 0;
  }
  const auto again = wire::encode_header(header);
  if (!std::equal(again.begin(), again.end(), header_frame.begin(), header_frame.end())) {
    std::fprintf(stderr, "a decoded header encodes to other bytes (%zu, was %zu)\n", again.size(),
                 header_frame.size());
    std::abort();
  }
  fuzz::Bytes payload;
  for (std::size_t i = 0; fuzz::take_frame(in, payload); ++i) {
    try {
      wire::check_payload(header, i, payload.size());
    } catch (const wire::ProtocolError&) {
    }
  }
  return 0;
}
