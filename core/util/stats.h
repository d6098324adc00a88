// Per-process counters of how connections ended up. They live in a small
// memfd page ("rdmashim-stats"), created at the first connection, so that
// `rdmashim stat` can read every process's counters through /proc/PID/fd
// without any file, socket or thread: the page dies with the process.
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

// The page's layout, read by `rdmashim stat` (checked there by magic+version).
//  0  magic     u64 kPageMagic
//  8  version   u32 kPageVersion
// 12  pid       i32
// 16  counts    u64[kCount] connections per Outcome, in enum order
struct Page {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  std::atomic<uint64_t> counts[static_cast<int>(Outcome::kCount)];
};
constexpr uint64_t kPageMagic = 0x7374617473686d72ull;  // "rmhstats"
constexpr uint32_t kPageVersion = 1;
constexpr const char kMemfdName[] = "rdmashim-stats";
static_assert(sizeof(Page) == 16 + 8 * static_cast<int>(Outcome::kCount));

const char* name(Outcome o);
void count(Outcome o);
uint64_t get(Outcome o);
// In a child after fork(): the inherited page is the parent's; start anew.
void after_fork_child();

}  // namespace rdmashim::stats
