// Verbs resources are ours to size (issue 12, finding 5): the Params a peer
// sends are checked before use, the ring the server registers is never more
// than its own TCP-equivalent limit, and the pool of registered buffers kept
// after connections close is bounded in bytes. Pure functions: no RDMA
// hardware needed.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ring/ring_limits.h"
#include "verbs/params.h"
#include "verbs/reg_pool.h"

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
