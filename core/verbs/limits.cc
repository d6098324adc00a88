#include "verbs/limits.h"

namespace rdmashim::verbs {

const char* refusal_text(Refusal r) {
  switch (r) {
    case Refusal::kNone: return "";
    case Refusal::kQueuePairs: return "device queue pairs";
    case Refusal::kCompletionQueues: return "device completion queues";
    case Refusal::kRegistrations: return "device memory regions";
    case Refusal::kMemory: return "verbs memory budget, RDMASHIM_VERBS_MEM";
  }
  return "";
}

uint64_t usable(uint64_t device_max) {
  if (device_max == 0) return UINT64_MAX;
  uint64_t spare = device_max / 8 > 4 ? device_max / 8 : 4;
  return device_max > spare ? device_max - spare : 0;
}

namespace {
bool fits(uint64_t used, uint64_t more, uint64_t limit) { return used <= limit && more <= limit - used; }
}  // namespace

Refusal admit_link(const DeviceLimits& lim, const VerbsUsage& u, uint64_t bytes, uint64_t budget) {
  if (!fits(u.qps, u.links_reserved + 1, usable(lim.max_qp))) return Refusal::kQueuePairs;
  if (!fits(u.cqs, u.links_reserved + 1, usable(lim.max_cq))) return Refusal::kCompletionQueues;
  // Pooled registrations go first when one is needed: not counted as used.
  uint64_t live_mrs = u.mrs > u.pooled_mrs ? u.mrs - u.pooled_mrs : 0;
  if (!fits(live_mrs, kLinkRegistrationsGrowing, usable(lim.max_mr))) return Refusal::kRegistrations;
  uint64_t live = u.registered > u.pooled ? u.registered - u.pooled : 0;
  if (!fits(live, bytes, budget)) return Refusal::kMemory;
  return Refusal::kNone;
}

Refusal admit_registration(const DeviceLimits& lim, const VerbsUsage& u, uint64_t bytes, uint64_t budget,
                           bool budgeted) {
  uint64_t live_mrs = u.mrs > u.pooled_mrs ? u.mrs - u.pooled_mrs : 0;
  if (!fits(live_mrs, 1, usable(lim.max_mr))) return Refusal::kRegistrations;
  uint64_t live = u.registered > u.pooled ? u.registered - u.pooled : 0;
  if (budgeted && !fits(live, bytes, budget)) return Refusal::kMemory;
  return Refusal::kNone;
}

uint64_t default_budget(uint64_t ram, uint64_t memlock, bool exempt) {
  uint64_t b = (ram ? ram : uint64_t{1} << 30) / 4;
  if (!exempt && memlock < b) b = memlock;
  return b;
}

}  // namespace rdmashim::verbs
