// core/util/fault: RDMASHIM_TEST_FAULT's syntax and which runs of a step fail.
#include "util/fault.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

namespace rdmashim::fault {
namespace {

TEST(Fault, ParsesStepsWithAndWithoutARun) {
  EXPECT_TRUE(configure("memfd"));
  EXPECT_TRUE(configure("memfd:2,handoff-send,ibv-qp-rtr:1"));
  EXPECT_TRUE(configure(""));
  EXPECT_FALSE(configure("no-such-step"));
  EXPECT_FALSE(configure("memfd:0"));
  EXPECT_FALSE(configure("memfd:x"));
  EXPECT_FALSE(configure("memfd:"));
  EXPECT_FALSE(configure("memf"));
}

TEST(Fault, EveryStepHasAName) {
  for (int s = 0; s < kStepCount; ++s) {
    const char* name = step_name(static_cast<Step>(s));
    ASSERT_NE(name, nullptr);
    EXPECT_STRNE(name, "?");
    EXPECT_TRUE(configure(name)) << name;
  }
}

TEST(Fault, FailsEveryRunOrOnlyTheNth) {
  uint8_t saved = g_state.load();
  ASSERT_TRUE(configure("mmap,seals:2"));
  g_state.store(kOn);
  errno = 0;
  EXPECT_TRUE(RDMASHIM_FAULT(kMmap));
  EXPECT_EQ(errno, EIO);
  EXPECT_TRUE(RDMASHIM_FAULT(kMmap));
  EXPECT_FALSE(RDMASHIM_FAULT(kSeals));
  EXPECT_TRUE(RDMASHIM_FAULT(kSeals));
  EXPECT_FALSE(RDMASHIM_FAULT(kSeals));
  EXPECT_FALSE(RDMASHIM_FAULT(kMemfd));
  g_state.store(kOff);
  EXPECT_FALSE(RDMASHIM_FAULT(kMmap));  // off: nothing fails
  ASSERT_TRUE(configure(""));
  g_state.store(saved);
}

}  // namespace
}  // namespace rdmashim::fault
