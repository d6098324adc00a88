// Leaving the ring mid-stream (core/conn/downgrade.cc), end to end over real
// loopback TCP with the shared-memory transport: every byte in order across
// the move, readiness after it, a reader blocked on the doorbell, and peers
// that never offered it.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "conn/connection.h"
#include "shm/rendezvous.h"
#include "wire/wire.h"
#include "loopback_pair.h"

namespace rdmashim {
namespace {

using test::pattern;
using test::send_all;
using test::TcpPair;

std::vector<unsigned char> recv_to_eof(Connection& c) {
  std::vector<unsigned char> out;
  unsigned char buf[7777];
  for (;;) {
    iovec iov{buf, sizeof buf};
    ssize_t r = c.recv(&iov, 1, 0);
    if (r <= 0) return out;
    out.insert(out.end(), buf, buf + r);
  }
}

ssize_t recv_some(Connection& c, void* p, size_t n, int flags = 0) {
  iovec iov{p, n};
  return c.recv(&iov, 1, flags);
}

// Both ends upgraded and switched: each direction on its ring.
void upgrade(Connection& client, Connection& server) {
  std::thread s([&] { EXPECT_EQ(server.finish_setup(2000), 0); });
  ASSERT_EQ(client.finish_setup(2000), 0);
  s.join();
  // The client's Switch goes with its first send: a byte each way settles both.
  ASSERT_EQ(send_all(client, "c", 1), 1);
  char b;
  ASSERT_EQ(recv_some(server, &b, 1), 1);
  ASSERT_EQ(send_all(server, "s", 1), 1);
  ASSERT_EQ(recv_some(client, &b, 1), 1);
  ASSERT_TRUE(client.on_ring());
  ASSERT_TRUE(server.on_ring());
}

bool eventually(const std::function<bool()>& ok) {
  for (int i = 0; i < 400; ++i) {
    if (ok()) return true;
    usleep(5000);
  }
  return false;
}

// What poll() would report to the application for `want`.
short app_poll(Connection& c, short want) {
  pollfd p{c.fd(), c.kernel_interest(want), 0};
  poll(&p, 1, 0);
  return c.poll_events(want, p.revents);
}

// Streams of several ring laps both ways; one side leaves the rings in the
// middle of them. Every byte arrives, in order, and both ends end as plain
// TCP (passthrough) with the reason said.
void stream_with_downgrade(bool client_starts) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  upgrade(*client, *server);
  auto up = pattern(3 << 20, 1), down = pattern(3 << 20, 2);
  std::vector<unsigned char> got_up, got_down;
  Connection& starter = client_starts ? *client : *server;
  auto writer = [&](Connection& c, const std::vector<unsigned char>& data, bool start) {
    size_t half = data.size() / 2;
    EXPECT_EQ(send_all(c, data.data(), half), static_cast<ssize_t>(half));
    if (start) {
      EXPECT_EQ(c.downgrade(wire::kDowngradeRequested), 0);
    } else {
      // The other side's writer leaves at its next send once its reader saw the ask.
      EXPECT_TRUE(eventually([&] { return c.downgraded(); }));
    }
    EXPECT_EQ(send_all(c, data.data() + half, data.size() - half), static_cast<ssize_t>(data.size() - half));
    EXPECT_EQ(c.shutdown(SHUT_WR), 0);
  };
  std::thread sr([&] { got_up = recv_to_eof(*server); });
  std::thread cr([&] { got_down = recv_to_eof(*client); });
  std::thread sw([&] { writer(*server, down, &starter == server.get()); });
  writer(*client, up, &starter == client.get());
  sw.join();
  sr.join();
  cr.join();
  EXPECT_TRUE(got_up == up);
  EXPECT_TRUE(got_down == down);
  EXPECT_TRUE(client->downgraded());
  EXPECT_TRUE(server->downgraded());
  EXPECT_TRUE(client->passthrough());
  EXPECT_TRUE(server->passthrough());
  EXPECT_FALSE(client->on_ring());
  EXPECT_FALSE(server->on_ring());
}

TEST(Downgrade, ClientLeavesMidStreamAndEveryByteArrivesInOrder) { stream_with_downgrade(true); }
TEST(Downgrade, ServerLeavesMidStreamAndEveryByteArrivesInOrder) { stream_with_downgrade(false); }

// Bytes still in the ring when the Downgrade arrives are read first, then
// the TCP bytes; readiness says POLLIN for each part and not after.
TEST(Downgrade, RingBytesComeBeforeTheTcpBytesAndPollFollows) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  upgrade(*client, *server);
  ASSERT_EQ(send_all(*server, "ring-bytes", 10), 10);
  ASSERT_EQ(server->downgrade(wire::kDowngradeLimit), 0);
  EXPECT_FALSE(server->downgraded());  // the Downgrade goes with the next send
  EXPECT_TRUE(app_poll(*client, POLLIN) & POLLIN);
  char buf[32];
  ASSERT_EQ(recv_some(*client, buf, sizeof buf), 10);
  EXPECT_EQ(memcmp(buf, "ring-bytes", 10), 0);
  // The ring is read to its end: nothing else is there yet.
  EXPECT_EQ(app_poll(*client, POLLIN) & POLLIN, 0);
  EXPECT_EQ(recv_some(*client, buf, sizeof buf, MSG_DONTWAIT), -EAGAIN);
  ASSERT_EQ(send_all(*server, "tcp-bytes", 9), 9);
  EXPECT_TRUE(server->downgraded());
  EXPECT_FALSE(server->passthrough());  // its rx waits for the client's answer
  // (Nagle may hold the small segments until the client's delayed ACK.)
  EXPECT_TRUE(eventually([&] { return (app_poll(*client, POLLIN) & POLLIN) != 0; }));
  ASSERT_EQ(recv_some(*client, buf, sizeof buf), 9);
  EXPECT_EQ(memcmp(buf, "tcp-bytes", 9), 0);
  // The client answers the server's ask with its next send (a Downgrade goes
  // only ahead of data): then it is plain TCP.
  EXPECT_FALSE(client->passthrough());
  ASSERT_EQ(send_all(*client, "answer", 6), 6);
  EXPECT_TRUE(client->passthrough());
  ASSERT_EQ(recv_some(*server, buf, 6, MSG_WAITALL), 6);
  EXPECT_EQ(memcmp(buf, "answer", 6), 0);
  EXPECT_TRUE(server->passthrough());
  EXPECT_TRUE(app_poll(*server, POLLOUT) & POLLOUT);
  // After both moved, the sockets carry the application's bytes only.
  ASSERT_EQ(write(t.client, "raw", 3), 3);
  ASSERT_EQ(recv(t.server, buf, 3, MSG_WAITALL), 3);
  EXPECT_EQ(memcmp(buf, "raw", 3), 0);
}

// A side that only reads never sends a frame of its own in answer to an
// Ask: landing on the peer's socket after the peer closed, it would draw an
// RST and the reader would lose what it had yet to read (interleave 1917).
TEST(Downgrade, AnAskIsAnsweredOnlyAheadOfData) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  upgrade(*client, *server);
  ASSERT_EQ(server->downgrade(wire::kDowngradeRequested), 0);
  ASSERT_EQ(send_all(*server, "last", 4), 4);
  ASSERT_EQ(server->shutdown(SHUT_WR), 0);
  char buf[8];
  ASSERT_EQ(recv_some(*client, buf, 4, MSG_WAITALL), 4);
  ASSERT_EQ(recv_some(*client, buf, sizeof buf), 0);  // EOF, after the Ask was read
  EXPECT_TRUE(client->downgraded());
  usleep(20000);
  EXPECT_EQ(recv(t.server, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT), -1);  // nothing came from the client
  EXPECT_EQ(errno, EAGAIN);
}

// After fork two processes share the client's side. The child reads the
// peer's Downgrade (its readiness look takes the frame off the TCP side);
// the parent, which never saw the frame, must still read the TCP bytes after
// it as data, not as frames. Our own direction keeps its ring while shared.
TEST(Downgrade, ForkSiblingFollowsTheDowngradeItDidNotSee) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  upgrade(*client, *server);
  ASSERT_EQ(send_all(*server, "ring", 4), 4);
  ASSERT_EQ(server->downgrade(wire::kDowngradeRequested), 0);
  ASSERT_EQ(send_all(*server, "tcp-bytes", 9), 9);  // the Downgrade, then these, raw
  pid_t pid = fork();
  if (pid == 0) {
    client->on_fork_child();
    char b[4];
    bool ok = recv_some(*client, b, 4, MSG_WAITALL) == 4 && memcmp(b, "ring", 4) == 0;
    for (int i = 0; i < 200 && ok && !client->downgraded(); ++i) {
      app_poll(*client, POLLIN);  // reads the Downgrade, moves the child's rx to TCP
      usleep(5000);
    }
    ok = ok && client->downgraded() && client->downgrade(wire::kDowngradeRequested) == -EBUSY;
    (void)client.release();  // the parent's; no destructor in this process
    _exit(ok ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char buf[16];
  ASSERT_EQ(recv_some(*client, buf, 9, MSG_WAITALL), 9);
  EXPECT_EQ(memcmp(buf, "tcp-bytes", 9), 0);
}

// A reader blocked on the doorbell (empty ring) hears the Downgrade on the
// TCP side and goes on reading there.
TEST(Downgrade, ReaderBlockedOnTheDoorbellFollowsToTcp) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  upgrade(*client, *server);
  std::string got;
  std::thread reader([&] {
    char buf[16];
    ssize_t n = recv_some(*client, buf, 5, MSG_WAITALL);
    if (n > 0) got.assign(buf, static_cast<size_t>(n));
  });
  usleep(20000);  // the reader sleeps on the doorbell by now
  ASSERT_EQ(server->downgrade(wire::kDowngradeDevice), 0);
  ASSERT_EQ(send_all(*server, "hello", 5), 5);
  reader.join();
  EXPECT_EQ(got, "hello");
  EXPECT_TRUE(client->downgraded());
}

// A writer blocked on a full ring is told to leave: what it had not put in
// the ring goes on TCP, after what it had.
TEST(Downgrade, WriterBlockedOnAFullRingMovesTheRestToTcp) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  std::unique_ptr<Connection> server(Connection::make_server(t.server));
  upgrade(*client, *server);
  auto data = pattern(64 << 20, 7);  // far more than the ring holds
  std::atomic<bool> done{false};
  std::thread writer([&] {
    EXPECT_EQ(send_all(*client, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    done = true;
    EXPECT_EQ(client->shutdown(SHUT_WR), 0);
  });
  // The ring fills (and grows as far as it may): the writer waits for room.
  int64_t last = -1;
  ASSERT_TRUE(eventually([&] {
    int64_t now = client->unsent_bytes();
    bool still = now > 0 && now == last;
    last = now;
    return still;
  }));
  ASSERT_FALSE(done);
  ASSERT_EQ(client->downgrade(wire::kDowngradeRequested), 0);
  auto got = recv_to_eof(*server);
  writer.join();
  EXPECT_TRUE(got == data);
  EXPECT_TRUE(server->downgraded());
}

// A client without the Hello flag (an older rdmashim) gets an Ack without
// the flag, and its server never sends it a Downgrade.
TEST(Downgrade, OlderClientIsNeverSentOne) {
  for (uint16_t flags : {uint16_t{0}, uint16_t{wire::kHelloFlagDowngrade}}) {
    TcpPair t;
    std::unique_ptr<Connection> server(Connection::make_server(t.server));
    wire::Hello h{};
    memcpy(h.magic, wire::kHelloMagic, 8);
    h.version = wire::kVersion;
    h.flags = flags;
    h.transports = wire::kTransportShm;
    memset(h.nonce, 0x44, sizeof h.nonce);
    UniqueFd rendezvous = shm::open_rendezvous(h.rendezvous, h.nonce);
    ASSERT_TRUE(rendezvous);
    ASSERT_EQ(write(t.client, &h, sizeof h), 64);
    char b;
    EXPECT_EQ(recv_some(*server, &b, 1, MSG_DONTWAIT), -EAGAIN);  // reads the Hello, answers
    wire::Ack ack{};
    ASSERT_EQ(recv(t.client, &ack, sizeof ack, MSG_WAITALL), static_cast<ssize_t>(sizeof ack));
    EXPECT_EQ(ack.transport, wire::kTransportShm);
    EXPECT_EQ(ack.flags, flags ? wire::kAckFlagDowngrade : 0);
    EXPECT_EQ(server->downgrade(wire::kDowngradeRequested), flags ? 0 : -ENOTSUP);
  }
}

// An Ack without the flag (an older server): the client never sends one.
TEST(Downgrade, OlderServerIsNeverSentOne) {
  TcpPair t;
  std::unique_ptr<Connection> client(Connection::make_client(t.client));
  ASSERT_TRUE(client);
  wire::Hello h{};
  ASSERT_EQ(recv(t.server, &h, sizeof h, MSG_WAITALL), static_cast<ssize_t>(sizeof h));
  EXPECT_EQ(h.flags & wire::kHelloFlagDowngrade, wire::kHelloFlagDowngrade);
  EXPECT_TRUE(wire::hello_understood(h));  // an optional bit: older servers upgrade all the same
  wire::Ack ack{};
  memcpy(ack.magic, wire::kAckMagic, 8);
  ack.version = wire::kVersion;
  memcpy(ack.nonce, h.nonce, sizeof ack.nonce);
  ASSERT_EQ(write(t.server, &ack, sizeof ack), static_cast<ssize_t>(sizeof ack));
  ASSERT_EQ(write(t.server, "pong", 4), 4);
  char buf[4];
  ASSERT_EQ(recv_some(*client, buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(client->downgrade(wire::kDowngradeRequested), -ENOTSUP);
}

TEST(Downgrade, WireLayout) {
  EXPECT_EQ(sizeof(wire::Downgrade), 16u);
  wire::FrameHeader h{sizeof(wire::Downgrade), static_cast<uint16_t>(wire::FrameType::kDowngrade), 0};
  EXPECT_TRUE(wire::valid(h));
  h.length = 8;
  EXPECT_FALSE(wire::valid(h));
  EXPECT_STREQ(wire::downgrade_reason_name(wire::kDowngradeDevice), "device");
  EXPECT_STREQ(wire::downgrade_reason_name(wire::kDowngradeResent), "resent");
  EXPECT_STREQ(wire::downgrade_reason_name(200), "unsaid");
}

}  // namespace
}  // namespace rdmashim
