// What the peer needs to reach our receive ring (the Params frame after a
// Hello or an Ack), and the checks on the peer's copy before any of it is
// used. Pure: no verbs library needed (the unit tests run without hardware).
//
// Sizing rule: each side registers at most its own TCP-equivalent ring
// (tcp_equivalent_ring_size: what TCP would buffer per direction on this
// host). The client offers its size; the server answers with the smaller of
// that and its own limit, and registers only that; the client uses the
// first ring_size bytes of what it registered. The peer never makes us
// register more than our own limit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ring/ring_limits.h"

namespace rdmashim::verbs {

//  0  qpn        u32 (24 bits used)
//  4  psn        u32 (24 bits used)
//  8  gid[16]
// 24  addr       u64 the sender's rx ring's address (in its process)
// 32  rkey       u32
// 36  ring_size  u32 Hello: the size the client registered (its offer);
//                    Ack: the size both directions use (<= the offer)
// 40  lid        u16
// 42  mtu        u8  (enum ibv_mtu: 1..5)
// 43  reserved   u8[5] reserved[0]: our own GID index (only we use it);
//                    reserved[1]: kParamsElastic (addr and rkey are the first
//                    region, min(kStartRegion, ring) bytes, of an elastic
//                    ring, verbs/regions.h; a peer without it is refused);
//                    reserved[2]: flags, kParamsBye: we understand
//                    kCtlBye (verbs/regions.h); the rest 0
struct Params {
  uint32_t qpn;
  uint32_t psn;
  unsigned char gid[16];
  uint64_t addr;
  uint32_t rkey;
  uint32_t ring_size;
  uint16_t lid;
  uint8_t mtu;
  uint8_t reserved[5];
};
inline constexpr uint8_t kParamsElastic = 1;
inline constexpr uint8_t kParamsBye = 1;  // in reserved[2]

static_assert(sizeof(Params) == 48 && offsetof(Params, addr) == 24 && offsetof(Params, ring_size) == 36 &&
              offsetof(Params, lid) == 40);

// Whether a peer's Params can be used at all: fields in their ranges, a
// ring size we accept, and a ring that does not wrap the address space.
// (The rkey and address are the peer's own: a wrong one only fails the
// peer's writes; our NIC never writes outside what we registered.)
constexpr bool params_plausible(const Params& p) {
  return p.qpn < (1u << 24) && p.psn < (1u << 24) && p.mtu >= 1 && p.mtu <= 5 && valid_ring_size(p.ring_size) &&
         p.addr <= UINT64_MAX - p.ring_size;
}

// Server: the ring size both directions use for a client that offered
// `offered`, given our own limit (tcp_equivalent_ring_size of the socket).
// 0 when the offer is unusable. Never more than own_limit.
constexpr size_t negotiated_ring_size(uint64_t offered, size_t own_limit) {
  if (!valid_ring_size(offered) || !valid_ring_size(own_limit)) return 0;
  return offered < own_limit ? static_cast<size_t>(offered) : own_limit;
}

// Client: whether the server's answer fits what we registered.
constexpr bool ring_size_acceptable(uint64_t answered, size_t registered) {
  return valid_ring_size(answered) && answered <= registered;
}

}  // namespace rdmashim::verbs
