// How many verbs connections a process may hold. Each link costs a queue
// pair, a share of a completion queue (verbs/shared_cq.h: a link being set
// up counts as a whole one) and kLinkRegistrations memory registrations
// (its first rx region, staging and control slots; two more while it grows),
// and pins what it registers. Before a link is made (and before any region
// is registered) the process's counts are checked against
//   - the device's limits (ibv_query_device: max_qp, max_cq, max_mr, for the
//     whole device), of which this process takes at most usable(): the rest
//     is left to other processes and to the regions live links grow into;
//   - a budget of registered (pinned) bytes per process: RDMASHIM_VERBS_MEM,
//     else default_budget().
// A link refused so stays on TCP (stats: tcp:verbs-limit); a region a live
// link would grow into is simply not registered (the ring keeps its size).
// Bytes the pool keeps for reuse count as free: the pool gives them up
// first. Pure: tests/unit/verbs_limits_test.cc.
#pragma once

#include <cstdint>

namespace rdmashim::verbs {

struct DeviceLimits {
  uint64_t max_qp = 0, max_cq = 0, max_mr = 0;  // 0: not known, not limited
};

struct VerbsUsage {
  uint64_t qps = 0, cqs = 0, mrs = 0;
  uint64_t registered = 0;  // bytes, the pool's included
  uint64_t pooled = 0;      // bytes the pool keeps
  uint64_t pooled_mrs = 0;  // registrations the pool keeps
  // Links admitted whose queue pair and completion queue are not made (and
  // counted in qps and cqs) yet: links set up at the same moment must not
  // together pass the device's limits.
  uint64_t links_reserved = 0;
};

enum class Refusal { kNone, kQueuePairs, kCompletionQueues, kRegistrations, kMemory };

// For the connection's log line ("tcp:verbs-limit (<this>)"); static strings.
const char* refusal_text(Refusal r);

// A link's registrations at rest, and the most it holds while growing.
inline constexpr uint64_t kLinkRegistrations = 3;
inline constexpr uint64_t kLinkRegistrationsGrowing = 5;

// What this process may use of a device maximum (0: unlimited): an eighth,
// at least 4, stays free.
uint64_t usable(uint64_t device_max);

// A new link that will register `bytes` (its first regions, staging and
// control slots). Its registrations are checked again, and counted, as they
// are made (Device::take).
Refusal admit_link(const DeviceLimits& lim, const VerbsUsage& u, uint64_t bytes, uint64_t budget);

// One more registration of `bytes` (a link's own, or a region it grows
// into); budgeted false for a smaller one that replaces a larger (a shrink),
// which only the registration limit applies to.
Refusal admit_registration(const DeviceLimits& lim, const VerbsUsage& u, uint64_t bytes, uint64_t budget,
                           bool budgeted);

// The budget without RDMASHIM_VERBS_MEM: a quarter of the RAM, and no more
// than RLIMIT_MEMLOCK when that applies (memlock: UINT64_MAX when
// unlimited; exempt: the process may lock past it, CAP_IPC_LOCK). ram 0:
// not known (1 GiB assumed).
uint64_t default_budget(uint64_t ram, uint64_t memlock, bool exempt);

}  // namespace rdmashim::verbs
