// discovery/short_lived: which client connections skip the upgrade because
// their destination's recent connections were short (RDMASHIM_SHORT_CONN_MS,
// 5 ms by default: the unit tests run without it set).
#include "discovery/short_lived.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include "util/config.h"

namespace rdmashim::discovery {
namespace {

constexpr uint64_t kMs = 1'000'000;

sockaddr_in v4(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

class ShortLived : public ::testing::Test {
 protected:
  void SetUp() override {
    if (config().short_conn_ms != 5) GTEST_SKIP() << "RDMASHIM_SHORT_CONN_MS is set in the environment";
    forget_short_for_tests();
  }
  void TearDown() override { forget_short_for_tests(); }
  bool skip(const sockaddr_in& a, uint64_t now) { return skip_short(reinterpret_cast<const sockaddr*>(&a), sizeof a, now); }
  // A connection to a made at `at` that lived `lived` ns.
  void conn(const sockaddr_in& a, uint64_t at, uint64_t lived) {
    note_closed(reinterpret_cast<const sockaddr*>(&a), sizeof a, at, at + lived);
  }
};

TEST_F(ShortLived, FirstConnectionsUpgradeThenShortOnesSkip) {
  auto a = v4("127.0.0.1", 5432);
  uint64_t t = 1000 * kMs;
  EXPECT_FALSE(skip(a, t));  // nothing known: upgrade
  conn(a, t, 100'000);      // 0.1 ms
  EXPECT_FALSE(skip(a, t + kMs));  // one short close is no streak
  conn(a, t + kMs, 200'000);
  EXPECT_TRUE(skip(a, t + 2 * kMs));
  // Another port or address of the same host is another destination.
  EXPECT_FALSE(skip(v4("127.0.0.1", 5433), t + 2 * kMs));
  EXPECT_FALSE(skip(v4("127.0.0.2", 5432), t + 2 * kMs));
}

TEST_F(ShortLived, LongConnectionEndsTheStreak) {
  auto a = v4("10.0.0.1", 80);
  uint64_t t = 1000 * kMs;
  conn(a, t, 100'000);
  conn(a, t + kMs, 100'000);
  ASSERT_TRUE(skip(a, t + 2 * kMs));
  conn(a, t + 2 * kMs, 6 * kMs);  // a skipped connection that lived longer than 5 ms
  EXPECT_FALSE(skip(a, t + 9 * kMs));
  conn(a, t + 9 * kMs, 100'000);
  EXPECT_FALSE(skip(a, t + 10 * kMs));  // the streak starts over
  conn(a, t + 10 * kMs, 100'000);
  EXPECT_TRUE(skip(a, t + 11 * kMs));
}

TEST_F(ShortLived, OneLateCloseDoesNotEndALongStreakTwoDo) {
  auto a = v4("127.0.0.1", 8080);
  uint64_t t = 1000 * kMs;
  for (int i = 0; i < 20; ++i) conn(a, t + i * kMs, 100'000);
  t += 20 * kMs;
  conn(a, t, 7 * kMs);  // a loaded machine delayed one close past 5 ms
  EXPECT_TRUE(skip(a, t + 8 * kMs));
  conn(a, t + 8 * kMs, 6 * kMs);  // and another right after: they live long now
  EXPECT_FALSE(skip(a, t + 15 * kMs));
}

TEST_F(ShortLived, QuietForgetsTheStreak) {
  auto a = v4("127.0.0.1", 6379);
  uint64_t t = 1000 * kMs;
  conn(a, t, 100'000);
  conn(a, t + kMs, 100'000);
  ASSERT_TRUE(skip(a, t + 2 * kMs));
  uint64_t later = t + kMs + 100'000 + kShortMemoryNs;
  EXPECT_FALSE(skip(a, later));  // a second after the last short close: upgrade again
  conn(a, later, 100'000);
  EXPECT_FALSE(skip(a, later + kMs));  // and the old streak does not count
}

TEST_F(ShortLived, Ipv6AndOtherFamilies) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(443);
  a.sin6_addr = in6addr_loopback;
  const auto* sa = reinterpret_cast<const sockaddr*>(&a);
  uint64_t t = 1000 * kMs;
  note_closed(sa, sizeof a, t, t + 1000);
  note_closed(sa, sizeof a, t + 10'000, t + 20'000);
  EXPECT_TRUE(skip_short(sa, sizeof a, t + 30'000));
  EXPECT_FALSE(skip_short(sa, sizeof(sockaddr_in), t + 30'000));  // truncated: not understood, no skip
  sockaddr un{};
  un.sa_family = AF_UNIX;
  note_closed(&un, sizeof un, t, t + 1);
  note_closed(&un, sizeof un, t, t + 1);
  EXPECT_FALSE(skip_short(&un, sizeof un, t + 2));
}

}  // namespace
}  // namespace rdmashim::discovery
