// How many verbs links a process may hold (verbs/limits.h): the device's
// limits with headroom, the registered-memory budget, the pool's buffers
// counted as free, growth refused past the budget while a shrink is not.
#include "verbs/limits.h"

#include <gtest/gtest.h>

namespace rdmashim::verbs {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
constexpr uint64_t kLink = 528 * kKiB;  // a default link: 256 KiB ring + 256 KiB staging + 16 KiB slots

TEST(VerbsLimits, UsableLeavesAnEighthOfTheDeviceToOthers) {
  EXPECT_EQ(usable(0), UINT64_MAX);  // not reported: not limited
  EXPECT_EQ(usable(65536), 65536u - 8192);
  EXPECT_EQ(usable(16), 12u);  // at least 4 spare
  EXPECT_EQ(usable(3), 0u);
}

TEST(VerbsLimits, AdmitsUntilTheMemoryBudgetThenRefuses) {
  DeviceLimits lim{65536, 65536, 65536};
  const uint64_t budget = 4 * kMiB;
  VerbsUsage u;
  int admitted = 0;
  while (admit_link(lim, u, kLink, budget) == Refusal::kNone) {
    ++admitted;
    u.qps += 1, u.cqs += 1, u.mrs += kLinkRegistrations, u.registered += kLink;
  }
  EXPECT_EQ(admitted, 7);  // 7 x 528 KiB = 3.6 MiB; an eighth would pass 4 MiB
  EXPECT_EQ(admit_link(lim, u, kLink, budget), Refusal::kMemory);
  EXPECT_STREQ(refusal_text(Refusal::kMemory), "verbs memory budget, RDMASHIM_VERBS_MEM");
  // One closes: there is room again.
  u.qps -= 1, u.cqs -= 1, u.mrs -= kLinkRegistrations, u.registered -= kLink;
  EXPECT_EQ(admit_link(lim, u, kLink, budget), Refusal::kNone);
}

TEST(VerbsLimits, PooledBuffersCountAsFree) {
  DeviceLimits lim{100, 100, 100};
  VerbsUsage u;
  u.registered = 4 * kMiB, u.pooled = 4 * kMiB, u.mrs = 16, u.pooled_mrs = 16;
  EXPECT_EQ(admit_link(lim, u, kLink, 4 * kMiB), Refusal::kNone);
  EXPECT_EQ(admit_registration(lim, u, kMiB, 4 * kMiB, true), Refusal::kNone);
  u.pooled = 0;
  EXPECT_EQ(admit_link(lim, u, kLink, 4 * kMiB), Refusal::kMemory);
}

TEST(VerbsLimits, EachDeviceLimitRefusesWithItsReason) {
  VerbsUsage u;
  u.qps = 10, u.cqs = 10, u.mrs = 30;
  EXPECT_EQ(admit_link({16, 100, 100}, u, kLink, kGiB), Refusal::kNone);  // 11 of 12 usable
  u.qps = 12;
  EXPECT_EQ(admit_link({16, 100, 100}, u, kLink, kGiB), Refusal::kQueuePairs);
  u.qps = 10, u.cqs = 12;
  EXPECT_EQ(admit_link({100, 16, 100}, u, kLink, kGiB), Refusal::kCompletionQueues);
  // Room for a link's registrations while it grows (5), not only at rest (3).
  u.cqs = 10, u.mrs = 84;  // usable(100) = 88
  EXPECT_EQ(admit_link({100, 100, 100}, u, kLink, kGiB), Refusal::kRegistrations);
  u.mrs = 83;
  EXPECT_EQ(admit_link({100, 100, 100}, u, kLink, kGiB), Refusal::kNone);
  EXPECT_STREQ(refusal_text(Refusal::kQueuePairs), "device queue pairs");
}

TEST(VerbsLimits, LinksBeingSetUpHoldTheirQueues) {
  // 10 queue pairs made, 1 link admitted whose queues are not made yet: of
  // 12 usable, one more fits and not two (two setting up at once would
  // otherwise both see 10).
  VerbsUsage u;
  u.qps = 10, u.cqs = 10, u.links_reserved = 1;
  EXPECT_EQ(admit_link({16, 100, 100}, u, kLink, kGiB), Refusal::kNone);
  u.links_reserved = 2;
  EXPECT_EQ(admit_link({16, 100, 100}, u, kLink, kGiB), Refusal::kQueuePairs);
  EXPECT_EQ(admit_link({100, 16, 100}, u, kLink, kGiB), Refusal::kCompletionQueues);
}

TEST(VerbsLimits, GrowthStopsAtTheBudgetAShrinkDoesNot) {
  DeviceLimits lim{0, 0, 0};
  VerbsUsage u;
  u.registered = 3 * kMiB + 768 * kKiB, u.mrs = 8;
  const uint64_t budget = 4 * kMiB;
  EXPECT_EQ(admit_registration(lim, u, kMiB, budget, true), Refusal::kMemory);  // a 1 MiB region: no
  EXPECT_EQ(admit_registration(lim, u, 256 * kKiB, budget, true), Refusal::kNone);
  EXPECT_EQ(admit_registration(lim, u, 256 * kKiB, 0, false), Refusal::kNone);  // back to small: yes
  // ... but never past the device's registrations.
  u.mrs = 12;
  EXPECT_EQ(admit_registration({0, 0, 16}, u, 256 * kKiB, budget, false), Refusal::kRegistrations);
}

TEST(VerbsLimits, DefaultBudgetIsAQuarterOfRamWithinMemlock) {
  EXPECT_EQ(default_budget(kGiB, UINT64_MAX, false), 256 * kMiB);
  EXPECT_EQ(default_budget(kGiB, 8 * kMiB, false), 8 * kMiB);  // the common ulimit -l
  EXPECT_EQ(default_budget(kGiB, 8 * kMiB, true), 256 * kMiB);  // CAP_IPC_LOCK: past the limit
  EXPECT_EQ(default_budget(0, UINT64_MAX, false), 256 * kMiB);  // RAM unknown: 1 GiB assumed
}

TEST(VerbsLimits, NoOverflowNearTheTop) {
  VerbsUsage u;
  u.registered = UINT64_MAX - 10;
  EXPECT_EQ(admit_link({}, u, kLink, UINT64_MAX), Refusal::kMemory);
  EXPECT_EQ(admit_registration({}, u, 5, UINT64_MAX, true), Refusal::kNone);
}

}  // namespace
}  // namespace rdmashim::verbs
