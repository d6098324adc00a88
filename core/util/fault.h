// Test-only failure injection at the setup steps of a transport
// (tests/preload/faults.sh, tests/softroce/faults.sh). With
// RDMASHIM_TEST_FAULT=<step>[:<nth>][,<step>[:<nth>]...] the named steps fail
// as if the call behind them had failed with EIO: every time, or only the
// nth time that step runs in this process (1-based). Each injected failure
// is logged at info level ("test fault: <step> made to fail"), so a test can
// tell a point that was reached from one that is missing. Unset (the only
// setting outside tests) a point costs one relaxed load and a branch
// predicted not taken.
//
// Use: `if (RDMASHIM_FAULT(kMemfd) || memfd_create(...) < 0)`, or for calls
// that return a descriptor or pointer, `RDMASHIM_FAULT(kX) ? -1 : call(...)`.
#pragma once

#include <atomic>
#include <cstdint>

#include "util/misc.h"

namespace rdmashim::fault {

// The names (what RDMASHIM_TEST_FAULT takes) are in fault.cc, in this order.
enum Step : uint8_t {
  // Same-host discovery (core/discovery).
  kAdvertise,       // server: binding the listener's advertisement
  kProbeSocket,     // client: the socket that looks for an advertisement
  kProbeConnect,    // client: connect() to the advertisement's name
  kSockdiag,        // either: the NETLINK_SOCK_DIAG socket (owner checks)
  kRandom,          // getrandom: the client's nonce (1st run) and rendezvous name (2nd), the server's token
  // Client: the rendezvous socket (core/shm/rendezvous.cc).
  kRendezvousSocket,
  kRendezvousFilter,    // SO_ATTACH_FILTER
  kRendezvousPasscred,  // SO_PASSCRED
  kRendezvousBind,
  // Server: the segment (core/shm/segment.cc) and its handover.
  kMemfd,
  kLocalPage,       // either side: the memfd of its own local page (shm/local_state.cc)
  kFtruncate,
  kSeals,
  kMmap,
  kHandoffSocket,
  kHandoffConnect,  // binding and connecting the server's doorbell to the client's rendezvous
  kHandoffSend,
  // Client: receiving and checking the segment.
  kHandoffRecv,
  kAttachStat,      // fstat of the memfd: a regular file of the right size
  kAttachSeals,     // F_GET_SEALS
  kDoorbellConnect, // connecting the rendezvous socket back to the server's (our doorbell)
  kAttachMmap,
  kAttachHeader,    // magic, version, ring size
  // Either side: the shared-memory ring is made one that cannot follow fork
  // or exec, as a verbs one cannot (the hand-over at fork/exec, tested on one host).
  kShmFork,
  // Verbs (core/verbs), either side.
  kIbvDevices,      // ibv_get_device_list
  kIbvOpen,         // ibv_open_device
  kIbvPd,           // ibv_alloc_pd
  kIbvMr,           // ibv_reg_mr (a ring)
  kIbvChannel,      // ibv_create_comp_channel
  kIbvCq,           // ibv_create_cq
  kIbvQp,           // ibv_create_qp
  kIbvQpInit,       // ibv_modify_qp to INIT
  kIbvGid,          // ibv_query_gid
  kIbvQpRtr,        // ibv_modify_qp to RTR
  kIbvQpRts,        // ibv_modify_qp to RTS
  // RDMA-CM discovery (core/discovery/remote.cc).
  kCmChannel,       // rdma_create_event_channel
  kCmId,            // rdma_create_id
  kCmBind,          // rdma_bind_addr (server)
  kCmListen,        // rdma_listen (server)
  kCmResolveAddr,   // rdma_resolve_addr (client)
  kCmResolveRoute,  // rdma_resolve_route (client)
  kCmConnect,       // rdma_connect (client)
  // Not a failure: the step blocks for good, as a wedged provider's call
  // would; the watchdog must leave the connection on TCP (block_forever()).
  kIbvQpBlock,      // ibv_create_qp never returns
  kIbvQpRtrBlock,   // ibv_modify_qp to RTR never returns
  kStepCount
};

const char* step_name(Step s);

// 0: the configuration was not read yet, 1: off, 2: on. Set by config().
inline std::atomic<uint8_t> g_state{0};
inline constexpr uint8_t kUnknown = 0, kOff = 1, kOn = 2;

// Parses RDMASHIM_TEST_FAULT (called by config()); false if malformed.
bool configure(const char* text);
// Whether this run of step s fails; if so errno is EIO. Reads the
// configuration if need be.
bool hit(Step s);

// For the *-block steps: never returns (the thread sleeps for good).
[[noreturn]] void block_forever();

inline bool fail(Step s) {
  return RDMASHIM_UNLIKELY(g_state.load(std::memory_order_relaxed) != kOff) && hit(s);
}

}  // namespace rdmashim::fault

#define RDMASHIM_FAULT(name) ::rdmashim::fault::fail(::rdmashim::fault::name)
