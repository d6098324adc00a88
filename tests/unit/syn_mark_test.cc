// The mark on an announcing client's SYN (discovery/syn_mark.h): what the
// saved headers say, that a real SYN carries it, that the program's own TTL
// comes back, and what a server that speaks first does with it.
#include "discovery/syn_mark.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "conn/connection.h"
#include "discovery/registry.h"
#include "util/unique_fd.h"

namespace rdmashim::test {
namespace {

using discovery::SynSays;

// A listener that keeps SYNs, and a client that connects to it, marked or
// not (after its program set `own_ttl`, 0: none), on IPv4 or IPv6 loopback.
struct MarkedPair {
  UniqueFd listener, client, server;
  discovery::Announcement announced;
  bool ok = false;
  MarkedPair(int family, bool mark, int own_ttl = 0) {
    listener = UniqueFd(socket(family, SOCK_STREAM, 0));
    sockaddr_storage a{};
    socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&a)->sin_family = AF_INET;
      reinterpret_cast<sockaddr_in*>(&a)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else {
      reinterpret_cast<sockaddr_in6*>(&a)->sin6_family = AF_INET6;
      reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr = in6addr_loopback;
    }
    if (bind(listener.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) return;  // no IPv6 here
    EXPECT_TRUE(discovery::keep_syns(listener.get()));
    EXPECT_EQ(listen(listener.get(), 4), 0);
    getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len);
    client = UniqueFd(socket(family, SOCK_STREAM, 0));
    if (own_ttl) {
      int level = family == AF_INET ? SOL_IP : SOL_IPV6, name = family == AF_INET ? IP_TTL : IPV6_UNICAST_HOPS;
      EXPECT_EQ(setsockopt(client.get(), level, name, &own_ttl, sizeof own_ttl), 0);
    }
    if (mark) announced = discovery::announce_client(client.get(), reinterpret_cast<sockaddr*>(&a), len);
    EXPECT_EQ(connect(client.get(), reinterpret_cast<sockaddr*>(&a), len), 0);
    server = UniqueFd(accept(listener.get(), nullptr, nullptr));
    ok = static_cast<bool>(server);
  }
};

int ttl_of(int fd, int family) {
  int v = 0;
  socklen_t len = sizeof v;
  getsockopt(fd, family == AF_INET ? SOL_IP : SOL_IPV6, family == AF_INET ? IP_TTL : IPV6_UNICAST_HOPS, &v, &len);
  return v;
}

TEST(SynMark, SaysWhatTheSavedHeadersSay) {
  unsigned char v4[40] = {0x45};
  v4[8] = 255;
  EXPECT_EQ(discovery::syn_says(v4, sizeof v4), SynSays::kMarked);
  v4[8] = 64;
  EXPECT_EQ(discovery::syn_says(v4, sizeof v4), SynSays::kUnmarked);
  unsigned char v6[60] = {0x60};
  v6[7] = 255;
  EXPECT_EQ(discovery::syn_says(v6, sizeof v6), SynSays::kMarked);
  v6[7] = 1;
  EXPECT_EQ(discovery::syn_says(v6, sizeof v6), SynSays::kUnmarked);
  // Too short to be a SYN, or no IP version we know: nothing is believed.
  EXPECT_EQ(discovery::syn_says(v6, 30), SynSays::kUnknown);
  EXPECT_EQ(discovery::syn_says(v4, 19), SynSays::kUnknown);
  EXPECT_EQ(discovery::syn_says(v4, 0), SynSays::kUnknown);
  unsigned char odd[40] = {0x55};
  EXPECT_EQ(discovery::syn_says(odd, sizeof odd), SynSays::kUnknown);
}

// The mark is on the SYN the server's kernel kept, read once; the client's
// program has its own TTL (set or default) back once the handshake settled.
TEST(SynMark, AnnouncingClientsSynIsMarkedAndItsOwnTtlComesBack) {
  for (int family : {AF_INET, AF_INET6}) {
    for (int own : {0, 17}) {
      SCOPED_TRACE(testing::Message() << (family == AF_INET ? "IPv4" : "IPv6") << " own TTL " << own);
      int fresh = ttl_of(UniqueFd(socket(family, SOCK_STREAM, 0)).get(), family);
      MarkedPair p(family, true, own);
      if (!p.ok && family == AF_INET6) continue;  // no IPv6 loopback
      ASSERT_TRUE(p.ok);
      ASSERT_TRUE(p.announced);
      EXPECT_TRUE(p.announced.mark.active());
      EXPECT_EQ(ttl_of(p.client.get(), family), discovery::kMarkTtl) << "marked until the handshake settles";
      EXPECT_EQ(discovery::read_syn(p.server.get()), SynSays::kMarked);
      EXPECT_EQ(discovery::read_syn(p.server.get()), SynSays::kUnknown) << "read once: the kernel frees it";
      p.announced.withdraw(p.client.get());
      EXPECT_EQ(ttl_of(p.client.get(), family), own ? own : fresh);
      EXPECT_FALSE(p.announced.mark.active());
    }
  }
}

TEST(SynMark, PlainClientsSynIsUnmarked) {
  MarkedPair p(AF_INET, false);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(discovery::read_syn(p.server.get()), SynSays::kUnmarked);
}

// A program that keeps SYNs itself reads them itself: not ours to take.
TEST(SynMark, SynsTheProgramKeepsAreNotOurs) {
  UniqueFd l(socket(AF_INET, SOCK_STREAM, 0));
  int on = 1;
  ASSERT_EQ(setsockopt(l.get(), IPPROTO_TCP, TCP_SAVE_SYN, &on, sizeof on), 0);
  EXPECT_FALSE(discovery::keep_syns(l.get()));
  UniqueFd fresh(socket(AF_INET, SOCK_STREAM, 0));
  EXPECT_TRUE(discovery::keep_syns(fresh.get()));
}

// A server that speaks first, to an announced client: held for its Hello
// when the SYN was marked, as before the mark existed; not asked about at
// all when it was not (a client that announced but did not mark, such as an
// older rdmashim, gets TCP: the mark is what a server believes first).
TEST(SynMark, ServerHoldsForAMarkedClientAndNotForAnUnmarkedOne) {
  for (bool mark : {true, false}) {
    SCOPED_TRACE(mark ? "marked" : "unmarked");
    MarkedPair p(AF_INET, mark);
    ASSERT_TRUE(p.ok);
    discovery::Announcement late;
    if (!mark) late = discovery::announce_client(p.client.get(), nullptr, 0);  // announced, unmarked
    ASSERT_TRUE(mark ? static_cast<bool>(p.announced) : static_cast<bool>(late));
    ASSERT_EQ(fcntl(p.server.get(), F_SETFL, fcntl(p.server.get(), F_GETFL) | O_NONBLOCK), 0);
    std::unique_ptr<Connection> server(Connection::make_server(p.server.get(), true));
    iovec iov{const_cast<char*>("banner"), 6};
    ssize_t n = server->send(&iov, 1, 0, sys::Calls::kSend);
    if (mark) {
      EXPECT_EQ(n, -EAGAIN) << "a marked, announced client's Hello is waited for";
    } else {
      EXPECT_EQ(n, 6) << "an unmarked client is not asked about";
      EXPECT_STREQ(server->transport_name(), "tcp:server-spoke-first");
    }
  }
}

}  // namespace
}  // namespace rdmashim::test
