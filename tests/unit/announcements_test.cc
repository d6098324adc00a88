// discovery/announcements: remote clients' "a Hello follows" records, as the
// RDMA-CM answering thread keeps them for a server that speaks first.
#include "discovery/announcements.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include "loopback_pair.h"
#include "util/misc.h"

namespace rdmashim::discovery {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kTtl = 2000 * kMs;

AnnounceKey key(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  socklen_t len;
  if (strchr(ip, ':')) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    inet_pton(AF_INET6, ip, &a->sin6_addr);
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    inet_pton(AF_INET, ip, &a->sin_addr);
    len = sizeof *a;
  }
  AnnounceKey k;
  EXPECT_TRUE(announce_key(reinterpret_cast<sockaddr*>(&ss), len, &k));
  return k;
}

struct Nonce {
  uint8_t b[16];
  explicit Nonce(int n) {
    memset(b, 0, sizeof b);
    memcpy(b, &n, sizeof n);
    b[15] = 0x5a;
  }
};

TEST(Announcements, KeyMapsIpv4IntoIpv6) {
  AnnounceKey v4 = key("10.77.0.2", 873), mapped = key("::ffff:10.77.0.2", 873), other = key("10.77.0.3", 873);
  EXPECT_EQ(memcmp(v4.addr, mapped.addr, 16), 0);
  EXPECT_NE(memcmp(v4.addr, other.addr, 16), 0);
  EXPECT_EQ(v4.port, 873);
  sockaddr s{};
  s.sa_family = AF_UNIX;
  AnnounceKey k;
  EXPECT_FALSE(announce_key(&s, sizeof s, &k));
}

TEST(Announcements, PendingUntilConsumedByItsNonce) {
  AnnouncementTable t;
  uint64_t now = 1000 * kMs;
  EXPECT_FALSE(t.pending(key("10.77.0.2", 873), now));
  ASSERT_TRUE(t.record(key("10.77.0.2", 873), Nonce(1).b, now, kTtl));
  EXPECT_TRUE(t.pending(key("10.77.0.2", 873), now));
  EXPECT_TRUE(t.pending(key("::ffff:10.77.0.2", 873), now));
  // Another port, another address: nothing announced there.
  EXPECT_FALSE(t.pending(key("10.77.0.2", 874), now));
  EXPECT_FALSE(t.pending(key("10.77.0.3", 873), now));
  EXPECT_FALSE(t.consume(Nonce(2).b));  // a Hello nobody announced
  EXPECT_TRUE(t.pending(key("10.77.0.2", 873), now));
  EXPECT_TRUE(t.consume(Nonce(1).b));
  EXPECT_FALSE(t.pending(key("10.77.0.2", 873), now));
  EXPECT_FALSE(t.consume(Nonce(1).b));  // once
}

TEST(Announcements, CountsTwoClientsOfOneHost) {
  AnnouncementTable t;
  uint64_t now = 1000 * kMs;
  ASSERT_TRUE(t.record(key("10.77.0.2", 873), Nonce(1).b, now, kTtl));
  ASSERT_TRUE(t.record(key("10.77.0.2", 873), Nonce(2).b, now, kTtl));
  EXPECT_FALSE(t.record(key("10.77.0.2", 873), Nonce(2).b, now, kTtl));  // the same nonce again
  EXPECT_EQ(t.size(now), 2u);
  EXPECT_TRUE(t.consume(Nonce(2).b));
  EXPECT_TRUE(t.pending(key("10.77.0.2", 873), now));  // the first one's Hello is still due
  EXPECT_TRUE(t.consume(Nonce(1).b));
  EXPECT_FALSE(t.pending(key("10.77.0.2", 873), now));
}

TEST(Announcements, ExpireAfterTheirTtl) {
  AnnouncementTable t;
  uint64_t now = 1000 * kMs;
  ASSERT_TRUE(t.record(key("10.77.0.2", 873), Nonce(1).b, now, kTtl));
  EXPECT_TRUE(t.pending(key("10.77.0.2", 873), now + kTtl - 1));
  EXPECT_FALSE(t.pending(key("10.77.0.2", 873), now + kTtl));
  EXPECT_EQ(t.size(now + kTtl), 0u);
  EXPECT_FALSE(t.consume(Nonce(1).b) && t.pending(key("10.77.0.2", 873), now + kTtl));
}

TEST(Announcements, BoundedPerAddressAndInAll) {
  AnnouncementTable t;
  uint64_t now = 1000 * kMs;
  int n = 0;
  // One address floods: it gets kPerAddress, no more.
  for (size_t i = 0; i < 3 * AnnouncementTable::kPerAddress; i++)
    n += t.record(key("10.0.0.66", 873), Nonce(static_cast<int>(i)).b, now, kTtl);
  EXPECT_EQ(static_cast<size_t>(n), AnnouncementTable::kPerAddress);
  // Many addresses: the table holds kSlots, then refuses (never grows).
  size_t total = AnnouncementTable::kPerAddress;
  for (int a = 1; a < 100 && total < AnnouncementTable::kSlots; a++) {
    char ip[32];
    snprintf(ip, sizeof ip, "10.1.%d.%d", a / 250, a % 250);
    for (size_t i = 0; i < AnnouncementTable::kPerAddress; i++)
      total += t.record(key(ip, 873), Nonce(1000 * a + static_cast<int>(i)).b, now, kTtl);
  }
  EXPECT_EQ(total, AnnouncementTable::kSlots);
  EXPECT_FALSE(t.record(key("10.77.0.2", 873), Nonce(999999).b, now, kTtl));
  EXPECT_FALSE(t.pending(key("10.77.0.2", 873), now));
  // Expired slots are reused.
  EXPECT_TRUE(t.record(key("10.77.0.2", 873), Nonce(999999).b, now + kTtl, kTtl));
  EXPECT_EQ(t.size(now + kTtl), 1u);
}

// The process's table is shared with the children it forks (a server that
// accepts and forks): a Hello consumed in a child is consumed for all.
TEST(Announcements, SharedWithForkedChildren) {
  AnnouncementTable* t = create_announcements();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(create_announcements(), t);
  uint64_t now = 1000 * kMs;
  ASSERT_TRUE(t->record(key("10.77.0.9", 9999), Nonce(7).b, now, kTtl));
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    remote_hello_arrived(Nonce(7).b);
    _exit(t->pending(key("10.77.0.9", 9999), now) ? 1 : 0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_FALSE(t->pending(key("10.77.0.9", 9999), now));
}

// The server's question, on an accepted socket: its peer's address and the
// port it was accepted on (the listener's) name the announcement.
TEST(Announcements, AcceptedSocketFindsItsPeersAnnouncement) {
  AnnouncementTable* t = create_announcements();
  ASSERT_NE(t, nullptr);
  test::TcpPair p;
  ASSERT_GE(p.server, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  ASSERT_EQ(getsockname(p.server, reinterpret_cast<sockaddr*>(&local), &len), 0);
  AnnounceKey k;
  ASSERT_TRUE(announce_key(reinterpret_cast<sockaddr*>(&local), len, &k));
  AnnounceKey from = key("127.0.0.1", k.port);
  EXPECT_FALSE(remote_client_announced(p.server));
  ASSERT_TRUE(t->record(from, Nonce(42).b, now_ns(), kTtl));
  EXPECT_TRUE(remote_client_announced(p.server));
  remote_hello_arrived(Nonce(42).b);
  EXPECT_FALSE(remote_client_announced(p.server));
}

}  // namespace
}  // namespace rdmashim::discovery
