// Process-wide settings, read once from RDMASHIM_* environment variables.
// Every variable is read here and nowhere else, and every one is documented
// in the README's table; bad values are reported once and replaced by the
// default, never fatal.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ring/ring_limits.h"

namespace rdmashim {

enum class TransportChoice { kAuto, kShm, kVerbs, kTcp };

// The one spelling of each choice ("auto", "shm", "verbs", "tcp"), for the
// environment, the tools' --transport and what they print.
const char* transport_name(TransportChoice t);
// False (and *out untouched) for anything but the four names.
bool parse_transport(const char* text, TransportChoice* out);
inline constexpr const char* kTransportNames = "auto|shm|verbs|tcp";

struct Config {
  TransportChoice transport = TransportChoice::kAuto;  // RDMASHIM_TRANSPORT
  uint32_t setup_timeout_ms = 2000;                    // RDMASHIM_SETUP_TIMEOUT_MS
  uint32_t spin_us = 50;                               // RDMASHIM_SPIN_US
  // RDMASHIM_RING_SIZE (power of two). When set, every ring is this size;
  // else shared-memory and verbs rings follow TCP's buffering
  // (tcp_equivalent_ring_size).
  size_t ring_size = kDefaultRingSize;
  bool ring_size_set = false;
  // RDMASHIM_VERBS_POOL: registered bytes kept for reuse after connections
  // close (0: none); idle processes keep no more than this pinned.
  size_t verbs_pool_bytes = size_t{32} << 20;
  // RDMASHIM_VERBS_MEM: the most a process registers (pins) for verbs, the
  // pool included; past it new connections stay on TCP (tcp:verbs-limit)
  // and live ones stop growing their rings. 0: a quarter of the RAM, at
  // most RLIMIT_MEMLOCK where it applies (verbs/limits.h).
  uint64_t verbs_mem_bytes = 0;
  // RDMASHIM_HEARTBEAT_S: an idle verbs link re-sends its last credit this
  // often (some providers degrade QPs idle for tens of minutes).
  uint32_t heartbeat_s = 60;
  int log_level = 1;                                   // RDMASHIM_LOG: 0 off .. 3 debug
  int fork_generation = -1;                            // RDMASHIM_FORKGEN (-1: any)
  // RDMASHIM_SHORT_CONN_MS: a client whose recent connections to a
  // destination closed within this many ms keeps the next ones plain
  // (discovery/short_lived.h); 0 upgrades every connection.
  uint32_t short_conn_ms = 5;
  bool disabled = false;                               // RDMASHIM_DISABLE=1
  // RDMASHIM_SOFT_VERBS=1: verbs to other hosts even on a software RDMA
  // device (rxe, siw), which auto leaves on TCP (verbs/policy.h).
  bool soft_verbs = false;
  // RDMASHIM_DEVICE: the RDMA device by name; "" picks the first active one.
  char device[64] = {};
  int gid_index = -1;           // RDMASHIM_GID_INDEX (-1: chosen per connection)
  const char* peers = nullptr;  // RDMASHIM_PEERS, raw (parsed by discovery)
  // RDMASHIM_TEST_SCHEDULE=<seed>[,downgrade=<n>]: test only; perturbs the
  // timing of the steps marked in util/schedule.h (tests/interleave). Any
  // value turns it on. With downgrade=n every data call on a ring also takes
  // the connection back to TCP with probability 1/n (sched::downgrade_now).
  bool test_schedule_on = false;
  uint64_t test_schedule = 0;
  uint32_t test_downgrade = 0;  // n; 0: never
  // RDMASHIM_TEST_FAULT=<step>[:<nth>],...: test only; makes the named setup
  // steps fail (util/fault.h). Parsed and applied by fault::configure.
  bool test_fault_on = false;
  // RDMASHIM_LOG_FILE is applied to the logger directly (log::set_file).
};

// Parsed on first use; immutable afterwards.
const Config& config();

// Parses a decimal unsigned value with an optional k/m/g suffix (binary units).
// Returns false on anything else: no silent atoi() garbage.
bool parse_size(const char* text, uint64_t* out);

}  // namespace rdmashim
