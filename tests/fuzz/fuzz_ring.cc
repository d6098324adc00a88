// The ring reader (and writer) against a peer that publishes what it likes:
// cursors that jump backwards, past the ring, or wrap; bytes placed late.
// Both ends are RingChannels over a FakeLinkPair; the fuzzer's bytes are a
// program of operations. Checks, besides memory safety: a reader never
// reports more than a ring of bytes, and while the peer is honest the bytes
// read are exactly the bytes written, in order.
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "link/fake_link.h"
#include "ring/ring_channel.h"

namespace {

struct Reader {
  const uint8_t* p;
  size_t left;
  bool more() const { return left > 0; }
  uint8_t u8() {
    if (!left) return 0;
    --left;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{u8()} << (8 * i);
    return v;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return -1;
  Reader in{data, size};
  constexpr size_t kSizes[] = {64, 256, 4096};
  const size_t ring = kSizes[in.u8() % 3];
  rdmashim::FakeLinkPair pair(ring);
  pair.late_placement = in.u8() & 1;
  rdmashim::RingChannel writer(pair.a), reader(pair.b);
  bool honest = true;
  uint64_t wrote = 0, read = 0;  // stream positions while honest
  unsigned char out[8192], got[8192];
  while (in.more()) {
    uint8_t op = in.u8();
    size_t len = 1 + in.u8() * 32u % sizeof out;
    switch (op % 9) {
      case 0: {  // the peer writes (honestly) a run of its stream
        for (size_t i = 0; i < len; ++i) out[i] = static_cast<unsigned char>(wrote + i);
        iovec v{out, len};
        ssize_t n = writer.write(&v, 1);
        if (n > 0) wrote += static_cast<uint64_t>(n);
        break;
      }
      case 1:    // we read, with one or two iovecs
      case 2: {
        iovec v[2] = {{got, len / 2 + 1}, {got + len / 2 + 1, len - len / 2}};
        bool peek = op & 0x10;
        ssize_t n = reader.read(v, op % 9 == 1 ? 1 : 2, peek);
        if (n > static_cast<ssize_t>(ring)) abort();
        if (honest && n > 0) {
          for (ssize_t i = 0; i < n; ++i) {
            if (got[i] != static_cast<unsigned char>(read + i)) abort();  // bytes lost, repeated or reordered
          }
          if (!peek) read += static_cast<uint64_t>(n);
        }
        break;
      }
      case 3: {  // the peer publishes a cursor of its choice
        honest = false;
        pair.a.bogus_tail_delta = static_cast<int64_t>(in.u64());
        pair.a.publish_tail(pair.a.own_tail());
        break;
      }
      case 4: {  // the peer grants credit of its choice
        honest = false;
        pair.b.bogus_head_delta = static_cast<int64_t>(in.u64());
        pair.b.publish_head(pair.b.own_head());
        break;
      }
      case 5: {  // small hostile nudges, the likely off-by-ones
        honest = false;
        pair.a.bogus_tail_delta = static_cast<int8_t>(in.u8());
        pair.a.publish_tail(pair.a.own_tail());
        break;
      }
      case 6: {
        ssize_t n = reader.discard(len);
        if (n > static_cast<ssize_t>(ring)) abort();
        if (honest && n > 0) read += static_cast<uint64_t>(n);
        break;
      }
      case 7: {
        ssize_t r = reader.readable();
        ssize_t w = writer.writable();
        if (r > static_cast<ssize_t>(ring) || w > static_cast<ssize_t>(ring)) abort();
        (void)reader.unread_hint();
        (void)writer.unacked_hint();
        (void)reader.readable_hint();
        (void)writer.writable_hint();
        break;
      }
      case 8:  // a process sharing the ring re-reads its cursors
        if (op & 0x10) reader.resync_rx();
        else writer.resync_tx();
        honest = false;  // the writer may rewrite bytes already read
        break;
    }
  }
  return 0;
}
