// Ring sizes every transport must accept, in one place. The ring protocol
// keeps 64-bit cursors; the verbs link carries positions modulo 2^31 in
// immediate data and the Params frame carries the size in a u32, both of
// which hold only while a ring is at most kMaxRingSize (static_asserts beside
// them).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmashim {

inline constexpr size_t kMinRingSize = size_t{4} << 10;    // one page
inline constexpr size_t kMaxRingSize = size_t{256} << 20;  // 2^28
inline constexpr size_t kDefaultRingSize = 1024 * 1024;  // tests/cat reads this line

// A size a peer or a user may ask for: a power of two within the limits.
constexpr bool valid_ring_size(uint64_t size) {
  return size >= kMinRingSize && size <= kMaxRingSize && (size & (size - 1)) == 0;
}

static_assert(valid_ring_size(kMinRingSize) && valid_ring_size(kMaxRingSize) &&
              valid_ring_size(kDefaultRingSize));

// The shared-memory ring for a connection on socket fd: RDMASHIM_RING_SIZE
// if set, else what TCP would buffer per direction on this host (the
// larger of tcp_wmem[2] + tcp_rmem[2] and the socket's SO_SNDBUF +
// SO_RCVBUF), rounded up to a power of two, at least kDefaultRingSize and at
// most kMaxRingSize. Its pages cost memory only once written (ring_sizing.cc).
size_t tcp_equivalent_ring_size(int fd);

// What every server on this host lets its own stream hold at least
// (tcp_equivalent_ring_size without socket options; RDMASHIM_RING_SIZE if
// set): the most a reader may wait for from any peer, whatever the ring's size.
size_t host_ring_size();

// The ring for a server's connection on socket fd whose client's socket
// reports peer_sndbuf as its SO_SNDBUF: TCP buffers the client's stream in
// that send buffer and in our receive buffer (the larger of SO_RCVBUF and
// tcp_rmem[2]), so the ring is at least that, and at least `own`
// (tcp_equivalent_ring_size), rounded up and capped the same way.
// RDMASHIM_RING_SIZE, if set, still decides alone.
size_t ring_size_for_client(int fd, size_t own, uint64_t peer_sndbuf);

}  // namespace rdmashim
