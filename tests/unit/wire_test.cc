#include <gtest/gtest.h>

#include "wire/wire.h"

namespace rdmashim::wire {
namespace {

TEST(Wire, MagicMatching) {
  EXPECT_EQ(match_magic(kHelloMagic, kHelloMagic, 8), Match::kYes);
  EXPECT_EQ(match_magic(kHelloMagic, kHelloMagic, 3), Match::kPartial);
  EXPECT_EQ(match_magic(kHelloMagic, kAckMagic, 8), Match::kNo);
  const unsigned char pg[] = {0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f};  // PostgreSQL SSLRequest
  EXPECT_EQ(match_magic(kHelloMagic, pg, sizeof pg), Match::kNo);
  const unsigned char resp[] = {'*', '1', '\r', '\n'};
  EXPECT_EQ(match_magic(kHelloMagic, resp, 1), Match::kNo);
}

TEST(Wire, FrameValidation) {
  EXPECT_TRUE(valid(FrameHeader{1, static_cast<uint16_t>(FrameType::kData), 0}));
  EXPECT_TRUE(valid(FrameHeader{kMaxDataFrame, static_cast<uint16_t>(FrameType::kData), 0}));
  EXPECT_FALSE(valid(FrameHeader{0, static_cast<uint16_t>(FrameType::kData), 0}));
  EXPECT_FALSE(valid(FrameHeader{kMaxDataFrame + 1, static_cast<uint16_t>(FrameType::kData), 0}));
  EXPECT_TRUE(valid(FrameHeader{0, static_cast<uint16_t>(FrameType::kSwitch), 0}));
  EXPECT_FALSE(valid(FrameHeader{4, static_cast<uint16_t>(FrameType::kSwitch), 0}));
  EXPECT_TRUE(valid(FrameHeader{8, static_cast<uint16_t>(FrameType::kClose), 0}));
  EXPECT_FALSE(valid(FrameHeader{7, static_cast<uint16_t>(FrameType::kClose), 0}));
  EXPECT_FALSE(valid(FrameHeader{0, 99, 0}));
}

}  // namespace
}  // namespace rdmashim::wire
