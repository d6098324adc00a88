// Verbs resources are ours to size (issue 12, finding 5): the Params a peer
// sends are checked before use, the ring the server registers is never more
// than its own TCP-equivalent limit, and the pool of registered buffers kept
// after connections close is bounded in bytes. Pure functions: no RDMA
// hardware needed.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "ring/ring_limits.h"
#include "verbs/params.h"
#include "verbs/reg_pool.h"
#include "verbs/verbs_transport.h"

namespace rdmashim::verbs {
namespace {

Params good_params(uint32_t ring) {
  Params p{};
  p.qpn = 0x1234;
  p.psn = 0xabcdef;
  p.addr = 0x7f0000000000ull;
  p.rkey = 42;
  p.ring_size = ring;
  p.mtu = 3;  // IBV_MTU_1024
  return p;
}

// A hostile client asks for the largest ring the wire allows: the server
// registers what it would itself buffer on TCP, not what it was asked.
TEST(VerbsSizing, HostileClientCannotMakeTheServerRegisterMore) {
  const size_t own = size_t{16} << 20;  // what tcp_equivalent_ring_size gives with Debian's defaults
  Params hostile = good_params(static_cast<uint32_t>(kMaxRingSize));
  ASSERT_TRUE(params_plausible(hostile));  // well-formed: only its size is greedy
  EXPECT_EQ(negotiated_ring_size(hostile.ring_size, own), own);
  EXPECT_EQ(negotiated_ring_size(hostile.ring_size, kDefaultRingSize), kDefaultRingSize);
  // A client offering less than our limit gets what it offered: it registered
  // only that much, and we must not write past it.
  EXPECT_EQ(negotiated_ring_size(size_t{2} << 20, own), size_t{2} << 20);
  EXPECT_EQ(negotiated_ring_size(own, own), own);
}

TEST(VerbsSizing, UnusableOffersAreRefused) {
  const size_t own = size_t{16} << 20;
  EXPECT_EQ(negotiated_ring_size(0, own), 0u);
  EXPECT_EQ(negotiated_ring_size(3u << 20, own), 0u);         // not a power of two
  EXPECT_EQ(negotiated_ring_size(1024, own), 0u);             // below a page
  EXPECT_EQ(negotiated_ring_size(kMaxRingSize * 2, own), 0u);  // above the limit
}

TEST(VerbsSizing, ParamsOutOfRangeAreImplausible) {
  EXPECT_TRUE(params_plausible(good_params(1u << 20)));
  Params p = good_params(1u << 20);
  p.qpn = 1u << 24;
  EXPECT_FALSE(params_plausible(p));
  p = good_params(1u << 20);
  p.psn = 0xffffffff;
  EXPECT_FALSE(params_plausible(p));
  p = good_params(1u << 20);
  p.mtu = 0;
  EXPECT_FALSE(params_plausible(p));
  p.mtu = 6;
  EXPECT_FALSE(params_plausible(p));
  p = good_params(1u << 20);
  p.addr = UINT64_MAX - 4096;  // the ring would wrap the address space
  EXPECT_FALSE(params_plausible(p));
  p = good_params(5000);
  EXPECT_FALSE(params_plausible(p));
  p = good_params(static_cast<uint32_t>(kMaxRingSize));
  EXPECT_TRUE(params_plausible(p));
}

// The client registered its own size; the server may answer less, never more.
TEST(VerbsSizing, ClientAcceptsOnlyWhatItRegistered) {
  const size_t mine = size_t{16} << 20;
  EXPECT_TRUE(ring_size_acceptable(mine, mine));
  EXPECT_TRUE(ring_size_acceptable(size_t{1} << 20, mine));
  EXPECT_FALSE(ring_size_acceptable(size_t{32} << 20, mine));
  EXPECT_FALSE(ring_size_acceptable(kMaxRingSize, mine));
  EXPECT_FALSE(ring_size_acceptable((size_t{1} << 20) + 4096, mine));
}

Buffer buf(size_t size, bool remote, uintptr_t id) {
  return Buffer{reinterpret_cast<void*>(id << 12), size, reinterpret_cast<ibv_mr*>(id), remote};
}

size_t total(const std::vector<Buffer>& v) {
  size_t n = 0;
  for (const Buffer& b : v) n += b.size;
  return n;
}

// The old pool kept 16 buffers of any size: with 256 MiB rings, 4 GiB stayed
// registered after the connections were gone.
TEST(VerbsPool, BoundedInBytesWhateverTheRingSizes) {
  const size_t cap = size_t{32} << 20;
  RegPool pool(cap);
  std::vector<Buffer> drop;
  for (uintptr_t i = 1; i <= 16; ++i) pool.give_back(buf(kMaxRingSize, i % 2, i), &drop);
  EXPECT_EQ(pool.bytes(), 0u);  // each alone is larger than the cap
  EXPECT_EQ(total(drop), 16 * kMaxRingSize);
  drop.clear();
  for (uintptr_t i = 1; i <= 8; ++i) pool.give_back(buf(size_t{16} << 20, i % 2, i), &drop);
  EXPECT_LE(pool.bytes(), cap);
  EXPECT_EQ(pool.bytes() + total(drop), 8 * (size_t{16} << 20));  // nothing lost: kept or to deregister
  EXPECT_EQ(pool.count(), 2u);
}

TEST(VerbsPool, EvictsOldestAndReusesExactSizeAndKind) {
  RegPool pool(size_t{4} << 20);
  std::vector<Buffer> drop;
  pool.give_back(buf(size_t{1} << 20, true, 1), &drop);
  pool.give_back(buf(size_t{1} << 20, false, 2), &drop);
  pool.give_back(buf(size_t{2} << 20, true, 3), &drop);
  EXPECT_TRUE(drop.empty());
  pool.give_back(buf(size_t{1} << 20, true, 4), &drop);  // 5 MiB > 4: the oldest goes
  ASSERT_EQ(drop.size(), 1u);
  EXPECT_EQ(drop[0].mr, reinterpret_cast<ibv_mr*>(1));
  Buffer out{};
  EXPECT_FALSE(pool.take(size_t{2} << 20, false, &out));  // kind must match
  ASSERT_TRUE(pool.take(size_t{1} << 20, true, &out));
  EXPECT_EQ(out.mr, reinterpret_cast<ibv_mr*>(4));  // newest first
  EXPECT_EQ(pool.bytes(), size_t{3} << 20);
}

TEST(VerbsPool, CountIsBoundedAndZeroCapKeepsNothing) {
  RegPool pool(size_t{1} << 30);
  std::vector<Buffer> drop;
  for (uintptr_t i = 1; i <= 40; ++i) pool.give_back(buf(4096, true, i), &drop);
  EXPECT_EQ(pool.count(), RegPool::kMaxEntries);
  EXPECT_EQ(drop.size(), 40 - RegPool::kMaxEntries);
  RegPool none(0);
  drop.clear();
  none.give_back(buf(4096, true, 1), &drop);
  EXPECT_EQ(none.count(), 0u);
  EXPECT_EQ(drop.size(), 1u);
}

}  // namespace
}  // namespace rdmashim::verbs

namespace rdmashim::verbs {
namespace {

// An unprivileged process with the common 8 MiB RLIMIT_MEMLOCK: its rings
// fit two connections in the limit (a 16 MiB TCP-sized ring would fail to
// register and leave every connection on TCP); with no limit, TCP's size.
TEST(VerbsSizing, RingFitsAnUnprivilegedMemlockLimit) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  int tcp = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(tcp, 0);
  size_t tcp_size = tcp_equivalent_ring_size(tcp);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit rl{8u << 20, 8u << 20};
    uint64_t got[2] = {VerbsTransport::ring_size_for(tcp), 0};
    if (geteuid() == 0 && setresuid(65534, 65534, 65534) != 0) _exit(3);  // as nobody
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(4);
    got[1] = VerbsTransport::ring_size_for(tcp);
    _exit(write(sv[1], got, sizeof got) == sizeof got ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  uint64_t got[2];
  ASSERT_EQ(read(sv[0], got, sizeof got), static_cast<ssize_t>(sizeof got));
  if (getuid() == 0) {
    EXPECT_EQ(got[0], tcp_size);  // root: CAP_IPC_LOCK
  }
  EXPECT_LE(2 * (got[1] + VerbsLink::kStageBytes), uint64_t{8} << 20);
  EXPECT_TRUE(valid_ring_size(got[1]));
  EXPECT_GE(got[1], uint64_t{1} << 20);  // and not needlessly small
  close(tcp);
  close(sv[0]);
  close(sv[1]);
}

}  // namespace
}  // namespace rdmashim::verbs
