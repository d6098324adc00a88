// The server's first blocking read, which reads into the program's buffer
// before it looks for a Hello (Connection::read_first): a plain client's
// bytes are the program's as read, a Hello and the frames that came with it
// are taken out, and bytes that only begin like a Hello are held back only
// until they can be told apart. (That no peek is left is counted under
// strace: tests/preload/short_conns.sh syscalls.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "conn/connection.h"
#include "shm/rendezvous.h"
#include "util/misc.h"
#include "wire/wire.h"
#include "loopback_pair.h"

namespace rdmashim {
namespace {

using test::pattern;
using test::send_all;
using test::TcpPair;

// A server connection whose socket blocks, as the preload makes one after accept().
std::unique_ptr<Connection> blocking_server(int fd) { return Connection::make_server(fd, false, true); }

ssize_t recv_into(Connection& c, void* p, size_t n, int flags = 0) {
  iovec iov{p, n};
  return c.recv(&iov, 1, flags);
}

double seconds_since(uint64_t t0) { return static_cast<double>(now_ns() - t0) / 1e9; }

TEST(ReadFirst, PlainClientsBytesAreTheProgramsAsRead) {
  for (size_t cap : {size_t{8}, size_t{64}, size_t{4096}}) {
    TcpPair t;
    auto server = blocking_server(t.server);
    const char req[] = "GET / HTTP/1.0\r\nHost: x\r\n\r\n";
    ASSERT_EQ(write(t.client, req, sizeof req), static_cast<ssize_t>(sizeof req));
    std::vector<char> got, buf(cap);
    while (got.size() < sizeof req) {
      ssize_t r = recv_into(*server, buf.data(), cap);
      ASSERT_GT(r, 0) << "buffer " << cap;
      ASSERT_LE(static_cast<size_t>(r), cap);
      got.insert(got.end(), buf.data(), buf.data() + r);
    }
    EXPECT_EQ(memcmp(got.data(), req, sizeof req), 0) << "buffer " << cap;
    EXPECT_TRUE(server->passthrough());
    EXPECT_STREQ(server->transport_name(), "tcp:peer-plain");
  }
}

TEST(ReadFirst, EndOfStreamFirstIsThePrograms) {
  TcpPair t;
  auto server = blocking_server(t.server);
  ASSERT_EQ(shutdown(t.client, SHUT_WR), 0);
  char buf[64];
  EXPECT_EQ(recv_into(*server, buf, sizeof buf), 0);
  EXPECT_STREQ(server->transport_name(), "tcp:peer-plain");
}

// A client under rdmashim writes before the server reads: its Hello and the
// frames that followed it arrive in one read, and the program gets exactly
// its bytes, in order, with either buffer size (64 B: the Hello fills it).
TEST(ReadFirst, FramesThatCameWithTheHelloAreUnframedInPlace) {
  for (size_t cap : {size_t{64}, size_t{65536}}) {
    TcpPair t;
    std::unique_ptr<Connection> client(Connection::make_client(t.client));
    ASSERT_TRUE(client);
    auto server = blocking_server(t.server);
    auto first = pattern(300, 7);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(send_all(*client, first.data() + 100 * i, 100), 100);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // all of it in the server's socket
    std::vector<unsigned char> got, buf(cap);
    ssize_t r = recv_into(*server, buf.data(), cap);
    ASSERT_GT(r, 0);
    if (cap > 300) {
      EXPECT_EQ(r, 300) << "the three frames, in the read that took the Hello";
    }
    got.insert(got.end(), buf.data(), buf.data() + r);
    while (got.size() < first.size()) {
      r = recv_into(*server, buf.data(), cap);
      ASSERT_GT(r, 0);
      got.insert(got.end(), buf.data(), buf.data() + r);
    }
    EXPECT_TRUE(got == first) << "buffer " << cap;
    // And on from there, across the switch onto the ring.
    auto more = pattern(1 << 20, 8);
    std::thread s([&] {
      std::vector<unsigned char> rest;
      while (rest.size() < more.size()) {
        ssize_t n = recv_into(*server, buf.data(), cap);
        ASSERT_GT(n, 0);
        rest.insert(rest.end(), buf.data(), buf.data() + n);
      }
      EXPECT_TRUE(rest == more);
    });
    ASSERT_EQ(send_all(*client, more.data(), more.size()), static_cast<ssize_t>(more.size()));
    s.join();
    EXPECT_STREQ(client->transport_name(), "shm");
    EXPECT_STREQ(server->transport_name(), "shm");
  }
}

// A piece of the magic, then other bytes a little later: all of them are
// the program's, as soon as they came (not after the setup timeout).
TEST(ReadFirst, PieceOfTheMagicIsTheProgramsOnceOtherBytesFollow) {
  TcpPair t;
  auto server = blocking_server(t.server);
  const unsigned char piece[] = {0xFF, 'r'};
  ASSERT_EQ(write(t.client, piece, sizeof piece), 2);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(write(t.client, "xyz", 3), 3);
  });
  unsigned char buf[64];
  uint64_t t0 = now_ns();
  size_t got = 0;
  while (got < 5) {
    ssize_t r = recv_into(*server, buf + got, sizeof buf - got);
    ASSERT_GT(r, 0);
    got += static_cast<size_t>(r);
  }
  later.join();
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_EQ(memcmp(buf, "\xFFrxyz", 5), 0);
  EXPECT_TRUE(server->passthrough());
}

TEST(ReadFirst, PieceOfTheMagicIsTheProgramsAtTheEnd) {
  TcpPair t;
  auto server = blocking_server(t.server);
  const unsigned char piece[] = {0xFF, 'r', 'd'};
  ASSERT_EQ(write(t.client, piece, sizeof piece), 3);
  ASSERT_EQ(shutdown(t.client, SHUT_WR), 0);
  unsigned char buf[64];
  uint64_t t0 = now_ns();
  ASSERT_EQ(recv_into(*server, buf, sizeof buf), 3);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_EQ(memcmp(buf, piece, 3), 0);
  EXPECT_EQ(recv_into(*server, buf, sizeof buf), 0);
}

// A socket another process made non-blocking behind our back: a stalled
// piece of the magic is the program's after a millisecond, not the setup
// timeout (a non-blocking read must not wait).
TEST(ReadFirst, SocketMadeNonBlockingElsewhereWaitsOnlyAMoment) {
  TcpPair t;
  auto server = blocking_server(t.server);
  ASSERT_EQ(fcntl(t.server, F_SETFL, fcntl(t.server, F_GETFL) | O_NONBLOCK), 0);  // not through the hooks
  const unsigned char piece[] = {0xFF, 'r', 'd', 'm'};
  ASSERT_EQ(write(t.client, piece, sizeof piece), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  unsigned char buf[64];
  uint64_t t0 = now_ns();
  ASSERT_EQ(recv_into(*server, buf, sizeof buf), 4);
  EXPECT_LT(seconds_since(t0), 0.5);
  EXPECT_EQ(memcmp(buf, piece, 4), 0);
}

// A Hello split in two (a segment size below it) into a buffer smaller than
// the Hello: what lies past the buffer is only taken once the whole Hello is
// there, and none of it reaches the program. Here the server cannot
// understand it (another version): a negative Ack, the client's Plain, then
// its raw bytes.
TEST(ReadFirst, HelloSplitPastTheProgramsBufferIsTakenWhole) {
  TcpPair t;
  auto server = blocking_server(t.server);
  wire::Hello h{};
  memcpy(h.magic, wire::kHelloMagic, 8);
  h.version = wire::kVersion + 1;
  h.transports = wire::kTransportShm;
  memset(h.nonce, 0x44, sizeof h.nonce);
  UniqueFd rendezvous = shm::open_rendezvous(h.rendezvous, h.nonce);
  ASSERT_TRUE(rendezvous);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&h);
  ASSERT_EQ(write(t.client, bytes, 30), 30);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(write(t.client, bytes + 30, sizeof h - 30), static_cast<ssize_t>(sizeof h - 30));
    const wire::FrameHeader plain{0, static_cast<uint16_t>(wire::FrameType::kPlain), 0};
    EXPECT_EQ(write(t.client, &plain, sizeof plain), static_cast<ssize_t>(sizeof plain));
    EXPECT_EQ(write(t.client, "ping", 4), 4);
  });
  char buf[16];
  ASSERT_EQ(recv_into(*server, buf, sizeof buf), 4);
  later.join();
  EXPECT_EQ(memcmp(buf, "ping", 4), 0);
  wire::Ack ack{};
  ASSERT_EQ(recv(t.client, &ack, sizeof ack, MSG_WAITALL), static_cast<ssize_t>(sizeof ack));
  EXPECT_EQ(memcmp(ack.magic, wire::kAckMagic, 8), 0);
  EXPECT_EQ(ack.transport, 0);
}

// All of a client's connection in the socket before the first read: its
// Hello (answered with a negative Ack here), its Plain, one raw byte and its
// end. The end is the program's after the byte, not a reason to take the
// Hello for the program's bytes (interleave seed 2456).
TEST(ReadFirst, HelloFramesAndTheEndInOneRead) {
  TcpPair t;
  auto server = blocking_server(t.server);
  struct {
    wire::Hello h;
    wire::FrameHeader plain;
    char byte;
  } __attribute__((packed)) msg{};
  memcpy(msg.h.magic, wire::kHelloMagic, 8);
  msg.h.version = wire::kVersion + 1;
  msg.plain = {0, static_cast<uint16_t>(wire::FrameType::kPlain), 0};
  msg.byte = 'x';
  ASSERT_EQ(write(t.client, &msg, sizeof msg), static_cast<ssize_t>(sizeof msg));
  ASSERT_EQ(shutdown(t.client, SHUT_WR), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  char buf[4096];
  ASSERT_EQ(recv_into(*server, buf, sizeof buf), 1);
  EXPECT_EQ(buf[0], 'x');
  EXPECT_EQ(recv_into(*server, buf, sizeof buf), 0);
}

// A Hello followed by a frame of no known type, in one read or past it.
TEST(ReadFirst, GarbageAfterAHelloIsAReset) {
  for (size_t cap : {size_t{8}, size_t{4096}}) {
    TcpPair t;
    auto server = blocking_server(t.server);
    struct {
      wire::Hello h;
      unsigned char junk[8];
    } msg{};
    memcpy(msg.h.magic, wire::kHelloMagic, 8);
    msg.h.version = wire::kVersion;
    const unsigned char junk[8] = {1, 0, 0, 0, 0x77, 0x77, 0, 0};
    memcpy(msg.junk, junk, sizeof junk);
    ASSERT_EQ(write(t.client, &msg, sizeof msg), static_cast<ssize_t>(sizeof msg));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::vector<char> buf(cap);
    EXPECT_EQ(recv_into(*server, buf.data(), cap), -ECONNRESET) << "buffer " << cap;
  }
}

}  // namespace
}  // namespace rdmashim
