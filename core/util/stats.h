// Per-process counters of how connections ended up, read by `rdmashim stat`
// (through the stats file) and by tests (through the info log lines).
#pragma once

#include <atomic>
#include <cstdint>

namespace rdmashim::stats {

// Why a connection uses the transport it uses. Every TCP fallback has a reason.
enum class Outcome : int {
  kShm,                 // upgraded to the shared-memory rings
  kVerbs,               // upgraded to RDMA verbs rings
  kTcpNotAdvertised,    // client: no rdmashim listener for that address on this host
  kTcpPeerPlain,        // server: the client sent application bytes, not a Hello
  kTcpServerSpokeFirst, // the server's application wrote before a Hello arrived
  kTcpSetupFailed,      // both ends run rdmashim but building the transport failed
  kTcpTimeout,          // the handshake did not finish within RDMASHIM_SETUP_TIMEOUT_MS
  kTcpPolicy,           // RDMASHIM_TRANSPORT=tcp, RDMASHIM_FORKGEN or RDMASHIM_DISABLE said no
  kCount
};

const char* name(Outcome o);
void count(Outcome o);
uint64_t get(Outcome o);

}  // namespace rdmashim::stats
