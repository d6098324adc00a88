// The wire-level checks on their own (core/wire/wire.h): frame header
// validation, the Params frame check and the magic matcher, with their
// promises asserted: a valid header never announces more than a data frame
// or a control payload may hold, and match_magic never reads past `len`.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "wire/wire.h"

namespace wire = rdmashim::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= sizeof(wire::FrameHeader)) {
    wire::FrameHeader h;
    memcpy(&h, data, sizeof h);
    if (wire::valid(h)) {
      bool is_data = h.type == static_cast<uint16_t>(wire::FrameType::kData);
      if (is_data && (h.length == 0 || h.length > wire::kMaxDataFrame)) abort();
      if (!is_data && h.length > wire::kMaxControlPayload) abort();
    }
  }
  if (size >= sizeof(wire::ParamsFrame)) {
    wire::ParamsFrame f;
    memcpy(&f, data, sizeof f);
    if (wire::valid_params_frame(f) && !wire::valid(f.header)) abort();
  }
  // A heap copy of exactly `size` bytes: ASan sees any read beyond it. Never
  // null (as the callers' buffers), also for size 0.
  std::unique_ptr<unsigned char[]> copy(new unsigned char[size]);
  if (size) memcpy(copy.get(), data, size);
  for (const auto* magic : {&wire::kHelloMagic, &wire::kAckMagic}) {
    wire::Match m = wire::match_magic(*magic, copy.get(), size);
    if (m == wire::Match::kYes && size < sizeof *magic) abort();
    if (m == wire::Match::kPartial && size >= sizeof *magic) abort();
  }
  return 0;
}
