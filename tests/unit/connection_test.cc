// The connection state machine end to end over real loopback TCP sockets,
// with the shared-memory transport: handshake, switch, fallbacks, EOF and
// half-close, errors, and the flags a byte stream must honour.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "conn/connection.h"
#include "conn/deferred_close.h"
#include "discovery/registry.h"
#include "shm/rendezvous.h"
#include "util/config.h"
#include "util/misc.h"
#include "wire/wire.h"
#include "loopback_pair.h"

namespace rdmashim {
namespace {

using test::pattern;
using test::send_all;
using test::TcpPair;

// Reads until EOF (or error), returns everything.
std::vector<unsigned char> recv_to_eof(Connection& c, int* err = nullptr) {
  std::vector<unsigned char> out;
  unsigned char buf[7777];
  for (;;) {
    iovec iov{buf, sizeof buf};
    ssize_t r = c.recv(&iov, 1, 0);
    if (r <= 0) {
      if (err) *err = static_cast<int>(r);
      return out;
    }
    out.insert(out.end(), buf, buf + r);
  }
}

ssize_t recv_some(Connection& c, void* p, size_t n, int flags = 0) {
  iovec iov{p, n};
  return c.recv(&iov, 1, flags);
}

TEST(Connection, UpgradesToSharedMemoryAndMovesLargeStreamsBothWays) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  // 3 MiB each way, several laps of the ring; the first bytes leave before
  // the Ack arrives and travel framed over TCP.
  auto up = pattern(3 << 20, 1), down = pattern(3 << 20, 2);
  std::vector<unsigned char> got_up, got_down;
  std::thread s([&] {
    got_up = recv_to_eof(*server);
    EXPECT_EQ(send_all(*server, down.data(), down.size()), static_cast<ssize_t>(down.size()));
    EXPECT_EQ(server->shutdown(SHUT_WR), 0);
  });
  ASSERT_EQ(send_all(*client, up.data(), up.size()), static_cast<ssize_t>(up.size()));
  ASSERT_EQ(client->shutdown(SHUT_WR), 0);
  got_down = recv_to_eof(*client);
  s.join();
  EXPECT_TRUE(got_up == up);
  EXPECT_TRUE(got_down == down);
  EXPECT_STREQ(client->transport_name(), "shm");
  EXPECT_STREQ(server->transport_name(), "shm");
}

TEST(Connection, PingPongStaysOrderedAcrossTheSwitch) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  std::thread s([&] {
    unsigned char b[16];
    for (int i = 0; i < 2000; ++i) {
      iovec iov{b, sizeof b};
      ASSERT_EQ(server->recv(&iov, 1, MSG_WAITALL), 16);
      ASSERT_EQ(send_all(*server, b, sizeof b), 16);
    }
  });
  for (int i = 0; i < 2000; ++i) {
    auto msg = pattern(16, static_cast<unsigned>(i));
    ASSERT_EQ(send_all(*client, msg.data(), 16), 16);
    unsigned char b[16];
    iovec iov{b, sizeof b};
    ASSERT_EQ(client->recv(&iov, 1, MSG_WAITALL), 16);
    ASSERT_EQ(memcmp(b, msg.data(), 16), 0) << "round trip " << i;
  }
  s.join();
  EXPECT_STREQ(client->transport_name(), "shm");
  EXPECT_STREQ(server->transport_name(), "shm");
}

TEST(Connection, PlainClientIsServedAsPlainTcp) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  const char hello[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(t.client, hello, sizeof hello), static_cast<ssize_t>(sizeof hello));
  char buf[64];
  ASSERT_EQ(recv_some(*server, buf, sizeof buf), static_cast<ssize_t>(sizeof hello));
  EXPECT_EQ(memcmp(buf, hello, sizeof hello), 0);
  EXPECT_TRUE(server->passthrough());
  EXPECT_STREQ(server->transport_name(), "tcp:peer-plain");
  // What the server sends reaches the plain client untouched.
  ASSERT_EQ(send_all(*server, "ok", 2), 2);
  ASSERT_EQ(read(t.client, buf, sizeof buf), 2);
  EXPECT_EQ(memcmp(buf, "ok", 2), 0);
}

TEST(Connection, PlainClientWhoseFirstByteLooksLikeOursIsStillPlain) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  const unsigned char telnet[] = {0xFF, 0xFB, 0x01, 'x'};  // IAC WILL ECHO
  ASSERT_EQ(write(t.client, telnet, sizeof telnet), 4);
  unsigned char buf[8];
  ASSERT_EQ(recv_some(*server, buf, sizeof buf), 4);
  EXPECT_EQ(memcmp(buf, telnet, 4), 0);
  EXPECT_TRUE(server->passthrough());
}

TEST(Connection, ServerThatSpeaksFirstStripsTheLateHelloAndBothStayPlain) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  const char greeting[] = "220 smtp ready\r\n";
  ASSERT_EQ(send_all(*server, greeting, sizeof greeting), static_cast<ssize_t>(sizeof greeting));
  EXPECT_STREQ(server->transport_name(), "tcp:server-spoke-first");
  // A Hello that crossed the greeting (a client seeing the greeting first
  // sends none, see below), then that client's Plain and its first bytes.
  wire::Hello hello{};
  memcpy(hello.magic, wire::kHelloMagic, sizeof hello.magic);
  hello.version = wire::kVersion;
  hello.transports = wire::kTransportShm;
  wire::FrameHeader plain{0, static_cast<uint16_t>(wire::FrameType::kPlain), 0};
  ASSERT_EQ(send(t.client, &hello, sizeof hello, 0), static_cast<ssize_t>(sizeof hello));
  ASSERT_EQ(send(t.client, &plain, sizeof plain, 0), static_cast<ssize_t>(sizeof plain));
  ASSERT_EQ(send(t.client, "EHLO x\r\n", 8, 0), 8);
  char buf[64];
  ASSERT_EQ(recv_some(*server, buf, 8, MSG_WAITALL), 8);
  EXPECT_EQ(memcmp(buf, "EHLO x\r\n", 8), 0);
}

// A server that spoke first and never read must not close with the client's
// Hello unread: its kernel would reset the connection and the client lose
// the greeting or see ECONNRESET where EOF is due.
TEST(Connection, ServerThatOnlyWroteConsumesTheHelloBeforeItsClose) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  std::vector<unsigned char> greeting = pattern(100000, 7);
  ASSERT_EQ(send_all(*server, greeting.data(), greeting.size()), static_cast<ssize_t>(greeting.size()));
  EXPECT_STREQ(server->transport_name(), "tcp:server-spoke-first");
  wire::Hello hello{};
  memcpy(hello.magic, wire::kHelloMagic, sizeof hello.magic);
  hello.version = wire::kVersion;
  hello.transports = wire::kTransportShm;
  ASSERT_EQ(send(t.client, &hello, sizeof hello, 0), static_cast<ssize_t>(sizeof hello));
  usleep(10000);
  server->drain_before_close();
  close(t.server);
  t.server = -1;
  std::vector<unsigned char> got(greeting.size());
  ASSERT_EQ(recv(t.client, got.data(), got.size(), MSG_WAITALL), static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, greeting);
  char c;
  EXPECT_EQ(recv(t.client, &c, 1, 0), 0) << strerror(errno);
}

// The server spoke first (and may have closed, banner and close): a client
// that sees its bytes before sending the Hello sends none, so a Hello can
// never land on a closed socket and reset the connection.
TEST(Connection, ClientSeeingTheServerSpeakFirstSendsNoHello) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  const char greeting[] = "220 smtp ready\r\n";
  ASSERT_EQ(send_all(*server, greeting, sizeof greeting), static_cast<ssize_t>(sizeof greeting));
  EXPECT_STREQ(server->transport_name(), "tcp:server-spoke-first");
  usleep(10000);
  EXPECT_FALSE(Connection::make_client(t.client));  // plain: nothing of ours sent
  char buf[64];
  ASSERT_EQ(recv(t.client, buf, sizeof greeting, MSG_WAITALL), static_cast<ssize_t>(sizeof greeting));
  EXPECT_EQ(memcmp(buf, greeting, sizeof greeting), 0);
  ASSERT_EQ(send(t.client, "EHLO x\r\n", 8, 0), 8);
  ASSERT_EQ(recv_some(*server, buf, 8, MSG_WAITALL), 8);
  EXPECT_EQ(memcmp(buf, "EHLO x\r\n", 8), 0);
}

TEST(Connection, HalfCloseKeepsTheOtherDirectionOpen) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  ASSERT_EQ(send_all(*client, "abc", 3), 3);
  char buf[8];
  ASSERT_EQ(recv_some(*server, buf, 3, MSG_WAITALL), 3);
  ASSERT_EQ(send_all(*server, "x", 1), 1);
  ASSERT_EQ(recv_some(*client, buf, 1), 1);
  ASSERT_EQ(send_all(*client, "defg", 4), 4);  // over the ring now
  ASSERT_EQ(client->shutdown(SHUT_WR), 0);
  ASSERT_EQ(recv_some(*server, buf, 8, MSG_WAITALL), 4);
  EXPECT_EQ(memcmp(buf, "defg", 4), 0);
  EXPECT_EQ(recv_some(*server, buf, 8), 0);  // EOF, and again
  EXPECT_EQ(recv_some(*server, buf, 8), 0);
  ASSERT_EQ(send_all(*server, "still", 5), 5);
  ASSERT_EQ(recv_some(*client, buf, 5, MSG_WAITALL), 5);
  EXPECT_EQ(memcmp(buf, "still", 5), 0);
  EXPECT_STREQ(client->transport_name(), "shm");
  EXPECT_STREQ(server->transport_name(), "shm");
  // Writing after our own shutdown is EPIPE, as the kernel says.
  EXPECT_EQ(send_all(*client, "no", 2), -EPIPE);
}

TEST(Connection, PeerCloseIsEndOfStreamAfterTheDataAndWritesThenFail) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  ASSERT_EQ(send_all(*client, "1", 1), 1);
  char buf[8];
  ASSERT_EQ(recv_some(*server, buf, 1), 1);
  ASSERT_EQ(send_all(*server, "2", 1), 1);
  ASSERT_EQ(recv_some(*client, buf, 1), 1);
  ASSERT_EQ(send_all(*server, "tail", 4), 4);
  ASSERT_EQ(send_all(*client, "up", 2), 2);
  ASSERT_EQ(recv_some(*server, buf, 2, MSG_WAITALL), 2);
  // Both ends are on the ring: the close below is the ring's end of stream.
  EXPECT_STREQ(client->transport_name(), "shm");
  EXPECT_STREQ(server->transport_name(), "shm");
  // The server closes without shutdown(): only FIN tells the client.
  server.reset();
  close(t.server);
  t.server = -1;
  int err = 1;
  auto rest = recv_to_eof(*client, &err);
  EXPECT_EQ(std::string(rest.begin(), rest.end()), "tail");
  EXPECT_EQ(err, 0);
  // The peer's socket is gone: once the ring is full, writes fail.
  std::vector<unsigned char> big(1 << 20);
  ssize_t r = 0;
  for (int i = 0; i < 8 && r >= 0; ++i) r = send_all(*client, big.data(), big.size());
  EXPECT_EQ(r, -EPIPE);
}

// Both ends on the ring (shm), the client's ring stream at some position.
void upgrade_both(Connection& client, Connection& server) {
  char buf[8];
  ASSERT_EQ(send_all(client, "1", 1), 1);
  ASSERT_EQ(recv_some(server, buf, 1), 1);
  ASSERT_EQ(send_all(server, "2", 1), 1);
  ASSERT_EQ(recv_some(client, buf, 1), 1);
  ASSERT_EQ(send_all(client, "up", 2), 2);
  ASSERT_EQ(recv_some(server, buf, 2, MSG_WAITALL), 2);
  ASSERT_STREQ(client.transport_name(), "shm");
  ASSERT_STREQ(server.transport_name(), "shm");
}

// What Connection::announce_end puts on the TCP side before its FIN.
void send_close_frame(int fd, uint64_t end) {
  unsigned char f[sizeof(wire::FrameHeader) + sizeof end];
  wire::FrameHeader h{sizeof end, static_cast<uint16_t>(wire::FrameType::kClose), 0};
  memcpy(f, &h, sizeof h);
  memcpy(f + sizeof h, &end, sizeof end);
  ASSERT_EQ(send(fd, f, sizeof f, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof f));
}

// Both ends on the ring (shm); then the client's TCP side says its stream
// ends 4 bytes past what it wrote so far, and sends its FIN: a writer whose
// last ring writes were not confirmed by its shutdown's flush (verbs: a
// reader away from its socket) does so (Connection::announce_end).
struct AnnouncedEnd {
  TcpPair t;
  std::unique_ptr<Connection> client{Connection::make_client(t.client)};
  std::unique_ptr<Connection> server{Connection::make_server(t.server)};
  AnnouncedEnd() {
    upgrade_both(*client, *server);
    send_close_frame(t.client, client->tx_ring_position() + 4);
    EXPECT_EQ(shutdown(t.client, SHUT_WR), 0);
  }
};

// The reader's end of stream waits for the ring to get there. Before, the
// FIN ended the stream and the writes still on their way were lost (a clean
// EOF on a shorter stream).
TEST(Connection, FinAfterAnAnnouncedEndWaitsForTheRingToGetThere) {
  AnnouncedEnd a;
  Connection& server = *a.server;
  char buf[8];
  usleep(20'000);  // the frame and the FIN are there
  EXPECT_EQ(recv_some(server, buf, sizeof buf, MSG_DONTWAIT), -EAGAIN);
  EXPECT_EQ(server.poll_events(POLLIN, POLLIN | POLLRDHUP) & POLLIN, 0);  // not readable: no end yet
  std::thread late([&] {
    usleep(100'000);
    send_all(*a.client, "tail", 4);  // lands on the ring, as the verbs writes once the reader is back
  });
  EXPECT_EQ(recv_some(server, buf, sizeof buf, MSG_WAITALL), 4);  // waits for them, not ended by the FIN
  late.join();
  EXPECT_EQ(memcmp(buf, "tail", 4), 0);
  EXPECT_NE(server.poll_events(POLLIN, POLLIN | POLLRDHUP) & POLLIN, 0);  // now the end
  EXPECT_EQ(recv_some(server, buf, sizeof buf), 0);
  EXPECT_EQ(recv_some(server, buf, sizeof buf), 0);
}

// The same writer gone before its announced writes landed (its QP with
// them): the reader's ping after the FIN draws its kernel's RST, and the
// stream ends in ECONNRESET, never in a clean EOF.
TEST(Connection, AnnouncedEndOfAWriterThatIsGoneIsAReset) {
  AnnouncedEnd a;
  a.client.reset();
  close(a.t.client);
  a.t.client = -1;
  timeval tv{5, 0};  // a hang fails the test rather than the suite
  ASSERT_EQ(setsockopt(a.t.server, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
  char buf[8];
  uint64_t start = now_ns();
  EXPECT_EQ(recv_some(*a.server, buf, sizeof buf), -ECONNRESET);
  EXPECT_LT(now_ns() - start, 2'000'000'000ull);
  EXPECT_EQ(recv_some(*a.server, buf, sizeof buf), 0);  // the error once, then the end
}

TEST(Connection, PeekWaitallAndDontwaitOnTheRing) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  std::thread setup([&] { EXPECT_EQ(server->finish_setup(2000), 0); });
  ASSERT_EQ(client->finish_setup(2000), 0);
  setup.join();
  char buf[16];
  EXPECT_EQ(recv_some(*client, buf, sizeof buf, MSG_DONTWAIT), -EAGAIN);
  ASSERT_EQ(send_all(*server, "0123456789", 10), 10);
  ASSERT_EQ(recv_some(*client, buf, 4, MSG_PEEK | MSG_WAITALL), 4);
  EXPECT_EQ(memcmp(buf, "0123", 4), 0);
  ASSERT_EQ(recv_some(*client, buf, 10, MSG_WAITALL), 10);
  EXPECT_EQ(memcmp(buf, "0123456789", 10), 0);
  EXPECT_EQ(recv_some(*client, buf, sizeof buf, MSG_DONTWAIT), -EAGAIN);
  std::thread late([&] {
    usleep(20000);
    send_all(*server, "ab", 1);
    usleep(20000);
    send_all(*server, "b", 1);
  });
  ASSERT_EQ(recv_some(*client, buf, 2, MSG_WAITALL), 2);  // spans two writes
  late.join();
  EXPECT_STREQ(server->transport_name(), "shm");
  EXPECT_STREQ(client->transport_name(), "shm");
}

TEST(Connection, GarbageFromARdmashimPeerIsAResetNotACrash) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  wire::Hello h{};
  memcpy(h.magic, wire::kHelloMagic, 8);
  h.version = wire::kVersion;
  ASSERT_EQ(write(t.client, &h, sizeof h), 64);
  const unsigned char junk[8] = {1, 0, 0, 0, 0x77, 0x77, 0, 0};  // a frame of unknown type
  ASSERT_EQ(write(t.client, junk, sizeof junk), 8);
  char buf[8];
  EXPECT_EQ(recv_some(*server, buf, sizeof buf), -ECONNRESET);
}

// A Hello this server does not understand (another version, or a flag it
// must know) is answered with a negative Ack: nothing upgrades, and after
// the client's Plain both directions carry the application's bytes as TCP.
void expect_negative_ack_for(uint16_t version, uint16_t flags, const char* outcome) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  wire::Hello h{};
  memcpy(h.magic, wire::kHelloMagic, 8);
  h.version = version;
  h.flags = flags;
  h.transports = wire::kTransportShm;
  memset(h.nonce, 0x33, sizeof h.nonce);
  // A live rendezvous, as a real client has: only the version check stands
  // between this Hello and an offer of shared memory.
  UniqueFd rendezvous = shm::open_rendezvous(h.rendezvous, h.nonce);
  ASSERT_TRUE(rendezvous);
  ASSERT_EQ(write(t.client, &h, sizeof h), 64);
  const wire::FrameHeader plain{0, static_cast<uint16_t>(wire::FrameType::kPlain), 0};
  ASSERT_EQ(write(t.client, &plain, sizeof plain), static_cast<ssize_t>(sizeof plain));
  ASSERT_EQ(write(t.client, "ping", 4), 4);
  char buf[8];
  ASSERT_EQ(recv_some(*server, buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(memcmp(buf, "ping", 4), 0);
  EXPECT_STREQ(server->transport_name(), outcome);
  wire::Ack ack{};
  ASSERT_EQ(recv(t.client, &ack, sizeof ack, MSG_WAITALL), static_cast<ssize_t>(sizeof ack));
  EXPECT_EQ(memcmp(ack.magic, wire::kAckMagic, 8), 0);
  EXPECT_EQ(ack.version, wire::kVersion);
  EXPECT_EQ(ack.transport, 0) << "version " << version << " flags " << flags;
  EXPECT_EQ(ack.fallback, wire::kFallbackSetupFailed);  // so the client logs the same reason
  EXPECT_EQ(memcmp(ack.nonce, h.nonce, sizeof ack.nonce), 0);
  ASSERT_EQ(send_all(*server, "pong", 4), 4);  // raw after a negative Ack
  ASSERT_EQ(recv(t.client, buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(memcmp(buf, "pong", 4), 0);
}

TEST(Connection, HelloOfAnUnknownVersionGetsANegativeAck) {
  expect_negative_ack_for(wire::kVersion + 1, 0, "tcp:setup-failed");
  expect_negative_ack_for(0, 0, "tcp:setup-failed");
}

TEST(Connection, HelloWithAnUnknownMustUnderstandFlagGetsANegativeAck) {
  expect_negative_ack_for(wire::kVersion, 0x0001, "tcp:setup-failed");
  expect_negative_ack_for(wire::kVersion, 0x0080, "tcp:setup-failed");
}

// A negative Ack says why; the client counts that reason (an older server's
// Ack says nothing: policy, as before).
TEST(Connection, ClientLogsTheReasonOfANegativeAck) {
  const struct {
    uint8_t fallback;
    const char* outcome;
  } cases[] = {{wire::kFallbackSetupFailed, "tcp:setup-failed"},
               {wire::kFallbackPolicy, "tcp:policy"},
               {wire::kFallbackUnsaid, "tcp:policy"}};
  for (const auto& c : cases) {
    TcpPair t;
    std::unique_ptr<Connection> client(Connection::make_client(t.client));
    ASSERT_TRUE(client);
    wire::Hello h{};
    ASSERT_EQ(recv(t.server, &h, sizeof h, MSG_WAITALL), static_cast<ssize_t>(sizeof h));
    wire::Ack ack{};
    memcpy(ack.magic, wire::kAckMagic, 8);
    ack.version = wire::kVersion;
    memcpy(ack.nonce, h.nonce, sizeof ack.nonce);
    ack.fallback = c.fallback;
    ASSERT_EQ(write(t.server, &ack, sizeof ack), static_cast<ssize_t>(sizeof ack));
    ASSERT_EQ(write(t.server, "pong", 4), 4);  // raw after a negative Ack
    char buf[4];
    ASSERT_EQ(recv_some(*client, buf, 4, MSG_WAITALL), 4);
    EXPECT_EQ(memcmp(buf, "pong", 4), 0);
    EXPECT_STREQ(client->transport_name(), c.outcome) << "fallback " << int{c.fallback};
  }
}

// The server may answer, write and close before the client reads its Ack
// (a banner and close): the client still attaches, since it learnt who owns
// the server's end (for the rendezvous credentials) while that end existed.
TEST(Connection, ClientAttachesAfterTheServerClosedItsEnd) {
  TcpPair t;
  // Announced, as the preload's clients are: a client that shut down writing
  // but is still there (a closed one withdraws it and gets no Ack).
  std::unique_ptr<Connection> client(Connection::make_client(t.client, discovery::announce_client(t.client, nullptr, 0)));
  ASSERT_TRUE(client);
  ASSERT_EQ(client->shutdown(SHUT_WR), 0);  // then the server's FIN closes our socket: no peer name left
  {
    std::unique_ptr<Connection> server(Connection::make_server(t.server));
    ASSERT_EQ(send_all(*server, "banner", 6), 6);  // the Hello is here: Ack, then the banner
    EXPECT_STREQ(server->transport_name(), "shm");
    ASSERT_EQ(server->shutdown(SHUT_WR), 0);
    unsigned char hello_rest[64];
    while (recv_some(*server, hello_rest, sizeof hello_rest, MSG_DONTWAIT) > 0) {
    }
  }
  close(t.server);
  t.server = -1;
  usleep(20000);  // both FINs exchanged: the server's socket is gone, ours is closed
  int err = 0;
  auto got = recv_to_eof(*client, &err);
  EXPECT_EQ(err, 0);
  EXPECT_EQ(std::string(got.begin(), got.end()), "banner");
  EXPECT_STREQ(client->transport_name(), "shm");
}

// A client that writes and closes before the Ack (nc -q0): its socket is held
// (deferred_close.h), the server finds its FIN with no announcement, sends no
// Ack but a refusal on the rendezvous, and reads every byte and a clean EOF;
// the held socket goes at the next look.
TEST(Connection, ClientClosedBeforeTheAckGetsNoneAndIsLetGo) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  auto data = pattern(5000, 11);
  ASSERT_EQ(send_all(*client, data.data(), data.size()), 5000);
  client->drain_before_close();
  EXPECT_TRUE(deferred_close::any());
  close(t.client);  // the program's number goes; the held duplicate stays
  client.reset();
  t.client = -1;
  usleep(10000);  // our FIN is at the server
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  int err = 0;
  auto got = recv_to_eof(*server, &err);
  EXPECT_EQ(err, 0);
  EXPECT_EQ(got, data);
  EXPECT_STREQ(server->transport_name(), "tcp:setup-failed");
  deferred_close::reap();  // the refusal is on the rendezvous
  EXPECT_FALSE(deferred_close::any());
}

// A close whose verbs writes are still in flight (Connection::Drain::
// kFlushing): the socket is held open (no FIN) while the flush is looked at
// in the background; once it is done the connection is let go first, then
// the duplicate closed (the FIN). One that never finishes goes at its
// deadline.
struct FakeFlush {
  std::atomic<int> looks{0};
  std::atomic<int> done_after{3};  // looks
  std::atomic<bool> released{false};
  std::atomic<int> fin_at_release{-1};  // the peer saw EOF when we let go: 1
  int peer = -1;
  std::atomic<int> last_looks{0};  // looks told the deadline passed
  static bool step(void* ctx, int, bool last) {
    auto* f = static_cast<FakeFlush*>(ctx);
    if (last) ++f->last_looks;
    return ++f->looks >= f->done_after.load();
  }
  static void release(void* ctx) {
    auto* f = static_cast<FakeFlush*>(ctx);
    char b;
    f->fin_at_release = recv(f->peer, &b, 1, MSG_DONTWAIT | MSG_PEEK) == 0 ? 1 : 0;
    f->released = true;
  }
};

bool eof_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  char b;
  return poll(&p, 1, ms) == 1 && recv(fd, &b, 1, MSG_DONTWAIT) == 0;
}

TEST(DeferredClose, FlushingSocketClosesOnlyOnceTheFlushIsDone) {
  TcpPair t;
  static FakeFlush f;  // static: a failed check must not leave the flusher a dangling context
  f.peer = t.server;
  f.done_after = 40;  // about 40 ms of looks
  deferred_close::Flushing what{&FakeFlush::step, &FakeFlush::release, &f};
  ASSERT_TRUE(deferred_close::hold_flushing(t.client, what, now_ns() + 5'000'000'000ull, 1, 0));
  EXPECT_TRUE(deferred_close::any());
  close(t.client);  // the program's number; the duplicate keeps the connection
  t.client = -1;
  EXPECT_FALSE(eof_within(t.server, 10));  // no FIN while the flush runs
  EXPECT_TRUE(eof_within(t.server, 3000));
  EXPECT_TRUE(f.released);
  EXPECT_EQ(f.fin_at_release, 0);  // let go before the FIN
  EXPECT_GE(f.looks, 40);
  for (int i = 0; i < 100 && deferred_close::any(); ++i) usleep(1000);
  EXPECT_FALSE(deferred_close::any());
}

TEST(DeferredClose, FlushingSocketGoesAtItsDeadline) {
  TcpPair t;
  static FakeFlush f;  // static: a failed check must not leave the flusher a dangling context
  f.peer = t.server;
  f.done_after = INT_MAX;  // a peer host that never answers
  deferred_close::Flushing what{&FakeFlush::step, &FakeFlush::release, &f};
  uint64_t start = now_ns();
  ASSERT_TRUE(deferred_close::hold_flushing(t.client, what, start + 100'000'000ull, 1, 0));
  close(t.client);
  t.client = -1;
  EXPECT_TRUE(eof_within(t.server, 3000));
  uint64_t took = now_ns() - start;
  EXPECT_GE(took, 100'000'000ull);
  EXPECT_LT(took, 2'000'000'000ull);
  EXPECT_TRUE(f.released);
  EXPECT_EQ(f.last_looks, 1);  // told once, before the FIN: a cut stream resets (Connection::linger_step)
}

// exec and exit wait for it (close-on-exec would drop the duplicate).
TEST(DeferredClose, FinishAllWaitsForFlushes) {
  TcpPair t;
  static FakeFlush f;  // static: a failed check must not leave the flusher a dangling context
  f.peer = t.server;
  f.done_after = 30;
  deferred_close::Flushing what{&FakeFlush::step, &FakeFlush::release, &f};
  ASSERT_TRUE(deferred_close::hold_flushing(t.client, what, now_ns() + 5'000'000'000ull, 1, 0));
  close(t.client);
  t.client = -1;
  deferred_close::finish_all();
  EXPECT_TRUE(f.released);
  EXPECT_FALSE(deferred_close::any());
  EXPECT_TRUE(eof_within(t.server, 1000));
}

// A flush that may linger half a minute in the background (a reader away)
// holds exit and exec at most the setup timeout, and is told it is the last
// look (the connection resets what is still unconfirmed).
TEST(DeferredClose, FinishAllWaitsAtMostTheSetupTimeout) {
  TcpPair t;
  static FakeFlush f;  // static: a failed check must not leave the flusher a dangling context
  f.peer = t.server;
  f.done_after = INT_MAX;
  deferred_close::Flushing what{&FakeFlush::step, &FakeFlush::release, &f};
  ASSERT_TRUE(deferred_close::hold_flushing(t.client, what, now_ns() + 60'000'000'000ull, 1, 0));
  close(t.client);
  t.client = -1;
  uint64_t start = now_ns();
  deferred_close::finish_all();
  uint64_t took = now_ns() - start;
  EXPECT_TRUE(f.released);
  EXPECT_EQ(f.last_looks, 1);
  EXPECT_GE(took, uint64_t{config().setup_timeout_ms} * 1'000'000 - 5'000'000);
  EXPECT_LT(took, uint64_t{config().setup_timeout_ms} * 1'000'000 + 1'000'000'000);
  EXPECT_FALSE(deferred_close::any());
  EXPECT_TRUE(eof_within(t.server, 1000));
}

// How many more descriptors this process can open before EMFILE.
int descriptors_left() {
  std::vector<int> got;
  for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) got.push_back(fd);
  for (int fd : got) close(fd);
  return static_cast<int>(got.size());
}

// A held socket sits where rdmashim keeps its own descriptors (above the
// soft limit): the program closed its number and may use it, and one more,
// exactly as on TCP. (Before: the duplicate took one of the program's
// numbers, so a server at its limit met EMFILE one accept sooner per held
// socket.)
TEST(DeferredClose, HeldSocketTakesNoneOfTheProgramsDescriptors) {
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 1024) GTEST_SKIP() << "hard RLIMIT_NOFILE below 1024: no room above the soft limit";
  TcpPair t;
  static FakeFlush f;
  f.peer = t.server;
  f.done_after = INT_MAX;  // held until told
  rlimit low = old;
  low.rlim_cur = 128;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  int before = descriptors_left();
  deferred_close::Flushing what{&FakeFlush::step, &FakeFlush::release, &f};
  bool held = deferred_close::hold_flushing(t.client, what, now_ns() + 5'000'000'000ull, 1, 0);
  close(t.client);
  t.client = -1;
  int after = descriptors_left();
  f.done_after = 0;
  // The FIN follows the release: the flusher is done with f (and t.server).
  bool fin = held && eof_within(t.server, 3000);
  setrlimit(RLIMIT_NOFILE, &old);
  ASSERT_TRUE(held);
  EXPECT_EQ(after, before + 1);
  EXPECT_TRUE(fin);
  EXPECT_TRUE(f.released);
  for (int i = 0; i < 100 && deferred_close::any(); ++i) usleep(1000);
  EXPECT_FALSE(deferred_close::any());
}

TEST(Wire, HelloWithOnlyOptionalFlagsIsUnderstood) {
  wire::Hello h{};
  memcpy(h.magic, wire::kHelloMagic, 8);
  h.version = wire::kVersion;
  h.flags = 0x8100;  // hints a server may ignore
  EXPECT_TRUE(wire::hello_understood(h));
  h.flags = 0x0002;
  EXPECT_FALSE(wire::hello_understood(h));
}

// A plain client that stalls after a true prefix of the magic: its bytes are
// its own after the setup timeout (default 2 s), the wait sleeps, and the
// socket's SO_RCVLOWAT is the application's again afterwards.
TEST(Connection, StalledPrefixOfTheMagicIsDeliveredAfterTheSetupTimeout) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  const unsigned char prefix[] = {0xFF, 'r', 'd', 'm'};
  ASSERT_EQ(write(t.client, prefix, sizeof prefix), 4);
  unsigned char buf[8];
  ASSERT_EQ(recv_some(*server, buf, sizeof buf, MSG_DONTWAIT), -EAGAIN);
  EXPECT_NE(server->prefix_deadline(), 0u);
  int lowat = 0;
  socklen_t len = sizeof lowat;
  ASSERT_EQ(getsockopt(t.server, SOL_SOCKET, SO_RCVLOWAT, &lowat, &len), 0);
  EXPECT_EQ(lowat, 5);  // the kernel wakes nobody before one more byte
  EXPECT_EQ(server->app_rcvlowat(), 1);
  timespec c0, w0, c1, w1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  clock_gettime(CLOCK_MONOTONIC, &w0);
  ASSERT_EQ(recv_some(*server, buf, sizeof buf), 4);  // blocking: waits out the deadline
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  clock_gettime(CLOCK_MONOTONIC, &w1);
  EXPECT_EQ(memcmp(buf, prefix, 4), 0);
  EXPECT_TRUE(server->passthrough());
  double wall = (w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) / 1e9;
  double cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) / 1e9;
  EXPECT_GT(wall, 1.0);
  EXPECT_LT(cpu, 0.02 * wall) << "the wait must sleep, not spin";
  ASSERT_EQ(getsockopt(t.server, SOL_SOCKET, SO_RCVLOWAT, &lowat, &len), 0);
  EXPECT_EQ(lowat, 1);
  EXPECT_EQ(server->prefix_deadline(), 0u);
}

// Waits for `want` the way the preload's poll does: asks the kernel what
// kernel_interest() says, sleeps no later than wake_deadline(), and returns
// what poll_events() reports (0 once `timeout_ms` passed).
short wait_ready(Connection& c, int fd, short want, int timeout_ms) {
  const uint64_t end = now_ns() + uint64_t(timeout_ms) * 1'000'000;
  for (;;) {
    uint64_t now = now_ns();
    if (now >= end) return 0;
    uint64_t wake = std::min(end, c.wake_deadline() ? c.wake_deadline() : end);
    pollfd p{fd, c.kernel_interest(want), 0};
    poll(&p, 1, wake > now ? static_cast<int>((wake - now + 999'999) / 1'000'000) : 0);
    if (short ev = c.poll_events(want, p.revents)) return ev;
  }
}

double seconds_since(uint64_t t0) { return static_cast<double>(now_ns() - t0) / 1e9; }

// A loopback pair whose client announced a Hello it has not sent (as a
// client under rdmashim does before its SYN), and a non-blocking server.
struct AnnouncedClient {
  TcpPair t;
  discovery::Announcement announced = discovery::announce_client(t.client, nullptr, 0);
  std::unique_ptr<Connection> server{Connection::make_server(t.server)};
  AnnouncedClient() {
    EXPECT_TRUE(announced);
    EXPECT_EQ(fcntl(t.server, F_SETFL, fcntl(t.server, F_GETFL) | O_NONBLOCK), 0);
  }
};

// A server that speaks first on a non-blocking socket, to a client that
// announced a Hello not here yet: its write gets EAGAIN at once (never a
// wait inside the call), the socket is not writable, and the Hello makes it
// writable, on the ring.
TEST(Connection, NonBlockingFirstWriteIsHeldForTheAnnouncedHelloNotWaited) {
  AnnouncedClient c;
  uint64_t t0 = now_ns();
  EXPECT_EQ(send_all(*c.server, "banner", 6), -EAGAIN);
  EXPECT_LT(seconds_since(t0), 0.1) << "a non-blocking write must not wait for the Hello";
  EXPECT_EQ(c.server->poll_events(POLLOUT, POLLOUT), 0) << "writable while held";
  EXPECT_EQ(c.server->kernel_interest(POLLOUT), POLLIN | POLLRDHUP);
  EXPECT_NE(c.server->wake_deadline(), 0u);
  EXPECT_EQ(wait_ready(*c.server, c.t.server, POLLOUT, 30), 0);
  std::unique_ptr<Connection> client(Connection::make_client(c.t.client, std::move(c.announced)));  // the Hello
  ASSERT_TRUE(client);
  EXPECT_EQ(wait_ready(*c.server, c.t.server, POLLOUT, 1000), POLLOUT);
  EXPECT_EQ(c.server->wake_deadline(), 0u);
  ASSERT_EQ(send_all(*c.server, "banner", 6), 6);
  char buf[6];
  ASSERT_EQ(recv_some(*client, buf, 6, MSG_WAITALL), 6);
  EXPECT_EQ(memcmp(buf, "banner", 6), 0);
  EXPECT_STREQ(c.server->transport_name(), "shm");
  EXPECT_STREQ(client->transport_name(), "shm");
}

// Told writable before its first write, a program must not then meet
// EAGAIN (TCP never does that to a fresh socket): no hold, the bytes go raw.
TEST(Connection, FirstWriteAfterPollSaidWritableIsNotHeld) {
  AnnouncedClient c;
  EXPECT_EQ(c.server->poll_events(POLLOUT, POLLOUT), POLLOUT);
  uint64_t t0 = now_ns();
  ASSERT_EQ(send_all(*c.server, "banner", 6), 6);
  EXPECT_LT(seconds_since(t0), 0.1);
  EXPECT_STREQ(c.server->transport_name(), "tcp:server-spoke-first");
}

// A client that announces a Hello and never sends it (a hostile one) holds
// back its own greeting for the setup timeout, then gets it raw.
TEST(Connection, HeldFirstWriteGoesOutRawAtTheSetupTimeout) {
  AnnouncedClient c;
  uint64_t t0 = now_ns();
  EXPECT_EQ(send_all(*c.server, "banner", 6), -EAGAIN);
  EXPECT_EQ(wait_ready(*c.server, c.t.server, POLLOUT, 5000), POLLOUT);
  double held = seconds_since(t0);
  EXPECT_GT(held, 1.5);
  EXPECT_LT(held, 3.5);
  ASSERT_EQ(send_all(*c.server, "banner", 6), 6);
  EXPECT_STREQ(c.server->transport_name(), "tcp:server-spoke-first");
  char buf[6];
  ASSERT_EQ(recv(c.t.client, buf, 6, MSG_WAITALL), 6);
  EXPECT_EQ(memcmp(buf, "banner", 6), 0);
}

// The announcement withdrawn without a Hello (the client gave up): the hold
// ends within milliseconds, not at the timeout.
TEST(Connection, HeldFirstWriteGoesOnceTheAnnouncementIsWithdrawn) {
  AnnouncedClient c;
  EXPECT_EQ(send_all(*c.server, "banner", 6), -EAGAIN);
  uint64_t t0 = now_ns();
  c.announced.withdraw(c.t.client);
  EXPECT_EQ(wait_ready(*c.server, c.t.server, POLLOUT, 5000), POLLOUT);
  EXPECT_LT(seconds_since(t0), 0.5);
  ASSERT_EQ(send_all(*c.server, "banner", 6), 6);
  char buf[6];
  ASSERT_EQ(recv(c.t.client, buf, 6, MSG_WAITALL), 6);
  EXPECT_EQ(memcmp(buf, "banner", 6), 0);
}

// A client's Hello offering verbs, with its Params frame, as a remote
// rdmashim client would send it.
struct VerbsHello {
  wire::Hello hello{};
  wire::ParamsFrame params{};
  explicit VerbsHello(uint32_t ring_size) {
    memcpy(hello.magic, wire::kHelloMagic, 8);
    hello.version = wire::kVersion;
    hello.transports = wire::kTransportVerbs;
    memset(hello.nonce, 0x5a, sizeof hello.nonce);
    params.header = {wire::kParamsBytes, static_cast<uint16_t>(wire::FrameType::kParams), 0};
    memcpy(params.params + 36, &ring_size, sizeof ring_size);  // verbs::Params::ring_size
  }
};

// This machine has no usable RDMA device (and the test makes sure of it):
// the server answers a negative Ack and both directions continue as plain
// TCP, not one byte lost or added.
TEST(Connection, VerbsOfferToAServerWithoutADeviceFallsBackToPlainTcp) {
  setenv("RDMASHIM_DEVICE", "no-such-rdma-device", 1);
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  VerbsHello vh(1u << 20);
  ASSERT_EQ(write(t.client, &vh, sizeof vh), static_cast<ssize_t>(sizeof vh));
  const wire::FrameHeader plain{0, static_cast<uint16_t>(wire::FrameType::kPlain), 0};
  ASSERT_EQ(write(t.client, &plain, sizeof plain), static_cast<ssize_t>(sizeof plain));
  ASSERT_EQ(write(t.client, "ping", 4), 4);
  char buf[8];
  ASSERT_EQ(recv_some(*server, buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(memcmp(buf, "ping", 4), 0);
  EXPECT_STREQ(server->transport_name(), "tcp:setup-failed");
  wire::Ack ack{};
  ASSERT_EQ(recv(t.client, &ack, sizeof ack, MSG_WAITALL), static_cast<ssize_t>(sizeof ack));
  EXPECT_EQ(memcmp(ack.magic, wire::kAckMagic, 8), 0);
  EXPECT_EQ(ack.transport, 0);
  EXPECT_EQ(memcmp(ack.nonce, vh.hello.nonce, sizeof ack.nonce), 0);
  ASSERT_EQ(send_all(*server, "pong", 4), 4);  // raw after a negative Ack
  ASSERT_EQ(recv(t.client, buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(memcmp(buf, "pong", 4), 0);
}

// A Params frame anywhere but right after a Hello or an Ack breaks the protocol.
TEST(Connection, StrayParamsFrameIsAReset) {
  TcpPair t;
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  wire::Hello h{};
  memcpy(h.magic, wire::kHelloMagic, 8);
  h.version = wire::kVersion;
  ASSERT_EQ(write(t.client, &h, sizeof h), 64);
  VerbsHello vh(1u << 20);
  ASSERT_EQ(write(t.client, &vh.params, sizeof vh.params), static_cast<ssize_t>(sizeof vh.params));
  char buf[8];
  EXPECT_EQ(recv_some(*server, buf, sizeof buf), -ECONNRESET);
}

TEST(Connection, ReadTimeoutIsHonoured) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  std::thread s([&] { server->finish_setup(2000); });
  ASSERT_EQ(client->finish_setup(2000), 0);
  s.join();
  // The timeout of the socket must hold for reads from the ring.
  ASSERT_STREQ(client->transport_name(), "shm");
  timeval tv{0, 50000};
  setsockopt(t.client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[4];
  EXPECT_EQ(recv_some(*client, buf, sizeof buf), -EAGAIN);
}

}  // namespace
}  // namespace rdmashim
