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

#include <arpa/inet.h>
#include <netinet/in.h>

#include "discovery/registry.h"

namespace rdmashim::discovery {
namespace {

TEST(PeerRules, ParsesForcedAndForbiddenPrefixes) {
  std::string bad;
  EXPECT_TRUE(parse_peer_rules("10.0.0.0/8,!10.1.0.0/16,fd00::/8,192.168.1.7", &bad));
  EXPECT_TRUE(parse_peer_rules("", &bad));
  EXPECT_FALSE(parse_peer_rules("10.0.0.0/33", &bad));
  EXPECT_EQ(bad, "10.0.0.0/33");
  EXPECT_FALSE(parse_peer_rules("not-an-address", &bad));
  EXPECT_FALSE(parse_peer_rules("10.0.0.0/x", &bad));
}

TEST(PeerRules, LoopbackIsLocalAndDocumentationRangeIsNot) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_TRUE(is_local_address(reinterpret_cast<sockaddr*>(&a), sizeof a));
  inet_pton(AF_INET, "192.0.2.1", &a.sin_addr);  // TEST-NET-1: never assigned here
  EXPECT_FALSE(is_local_address(reinterpret_cast<sockaddr*>(&a), sizeof a));
}

}  // namespace
}  // namespace rdmashim::discovery
