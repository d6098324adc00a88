// Unit tests of the rdma_send/rdma_recv building blocks: the XXH64 checksum
// (against the reference implementation's values), the stream format's
// checks, address parsing and the buffer pool's hand-over rules.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cat/common.h"
#include "cat/stream_format.h"
#include "cat/checksum.h"

using namespace rdmashim::cat;

namespace {

uint64_t xxh(const std::string& s) { return Xxh64::of(s.data(), s.size()); }

TEST(Xxh64, MatchesReferenceValues) {
  // Values printed by xxhsum -H64 (xxHash 0.8.1).
  EXPECT_EQ(xxh(""), 0xef46db3751d8e999ull);
  EXPECT_EQ(xxh("a"), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(xxh("abc"), 0x44bc2cf5ad770999ull);
  EXPECT_EQ(xxh("Nobody inspects the spammish repetition"), 0xfbcea83c8a378bf1ull);
}

TEST(Xxh64, StreamingEqualsOneShotForAnySplit) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data(5000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t len : {0, 1, 3, 4, 7, 8, 31, 32, 33, 63, 64, 65, 100, 1000, 5000}) {
    uint64_t want = Xxh64::of(data.data(), len);
    for (int trial = 0; trial < 20; ++trial) {
      Xxh64 x;
      size_t at = 0;
      while (at < len) {
        size_t n = std::min<size_t>(len - at, rng() % 70);
        x.update(data.data() + at, n);
        at += n;
      }
      ASSERT_EQ(x.digest(), want) << "len " << len;
    }
  }
}

TEST(Xxh64, DetectsOneFlippedBit) {
  std::vector<unsigned char> data(1 << 16, 0x5a);
  uint64_t a = Xxh64::of(data.data(), data.size());
  data[12345] ^= 0x10;
  EXPECT_NE(a, Xxh64::of(data.data(), data.size()));
}

TEST(StreamFormat, OwnMessagesPassTheirChecks) {
  EXPECT_TRUE(valid(make_greeting(kWantChecksum)));
  EXPECT_TRUE(valid(make_header(kSizeKnown | kHasChecksum, 123)));
  EXPECT_TRUE(valid(make_header(0, 123)));  // size unknown: stored as kUnknownSize
  EXPECT_EQ(make_header(0, 123).size, kUnknownSize);
  EXPECT_TRUE(valid(make_reply(kChecksumMismatch, 0, 1, 2)));
  Trailer t = make_trailer(42, true, 7);
  EXPECT_TRUE(valid_end(t.end));
  EXPECT_TRUE(valid_rest(t));
  EXPECT_EQ(t.end.position, 42u);
  EXPECT_EQ(t.flags, kHasChecksum);
  EXPECT_EQ(make_trailer(42, false, 7).checksum, 0u);
}

TEST(StreamFormat, RejectsWhatIsNotOurs) {
  Header h = make_header(kSizeKnown, 10);
  h.magic[0] ^= 1;
  EXPECT_FALSE(valid(h));
  h = make_header(kSizeKnown, 10);
  h.version = kVersion + 1;
  EXPECT_FALSE(valid(h));
  h = make_header(kSizeKnown, 10);
  h.flags |= 0x80;
  EXPECT_FALSE(valid(h));
  h = make_header(kSizeKnown, 10);
  h.size = kUnknownSize;  // "known" but unknown
  EXPECT_FALSE(valid(h));
  Greeting g = make_greeting(0);
  g.magic[7] = 'X';
  EXPECT_FALSE(valid(g));
  Reply r = make_reply(kOk, 0, 0, 0);
  r.status = 99;
  EXPECT_FALSE(valid(r));
  Trailer t = make_trailer(1, false, 0);
  t.flags = 4;
  EXPECT_FALSE(valid_rest(t));
}

TEST(StreamFormat, DataRecordsMustFollowOnExactly) {
  EXPECT_TRUE(valid_data(Record{kRecordData, 10, 100}, 100));
  EXPECT_FALSE(valid_data(Record{kRecordData, 10, 90}, 100));   // duplicate
  EXPECT_FALSE(valid_data(Record{kRecordData, 10, 110}, 100));  // gap
  EXPECT_FALSE(valid_data(Record{kRecordData, 0, 100}, 100));
  EXPECT_FALSE(valid_data(Record{kRecordData, kMaxRecord + 1, 100}, 100));
  EXPECT_FALSE(valid_data(Record{kRecordEnd, 10, 100}, 100));
  EXPECT_FALSE(valid_end(Record{kRecordEnd, 8, 100}));
}

TEST(Endpoint, Forms) {
  Endpoint e;
  ASSERT_TRUE(parse_endpoint("host:123", "d", false, &e));
  EXPECT_EQ(e.host, "host");
  EXPECT_EQ(e.port, 123);
  ASSERT_TRUE(parse_endpoint("host", "d", false, &e));
  EXPECT_EQ(e.port, kDefaultPort);
  ASSERT_TRUE(parse_endpoint(":5", "0.0.0.0", true, &e));
  EXPECT_EQ(e.host, "0.0.0.0");
  EXPECT_EQ(e.port, 5);
  ASSERT_TRUE(parse_endpoint("77", "0.0.0.0", true, &e));
  EXPECT_EQ(e.port, 77);
  ASSERT_TRUE(parse_endpoint("[::1]:9", "d", false, &e));
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 9);
  EXPECT_EQ(e.text(), "[::1]:9");
  ASSERT_TRUE(parse_endpoint("::1", "d", false, &e));
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, kDefaultPort);
  EXPECT_FALSE(parse_endpoint("host:", "d", false, &e));
  EXPECT_FALSE(parse_endpoint("host:70000", "d", false, &e));
  EXPECT_FALSE(parse_endpoint("host:12x", "d", false, &e));
  EXPECT_FALSE(parse_endpoint(":5", "", false, &e));  // rdma_send needs a host
  EXPECT_FALSE(parse_endpoint("[::1", "d", false, &e));
}

TEST(SlotPool, HandsSlotsOverInOrder) {
  SlotPool pool(3, 4096, 16);
  ASSERT_TRUE(pool.ok());
  Slot* a = pool.get_empty();
  Slot* b = pool.get_empty();
  ASSERT_TRUE(a && b);
  memset(a->data - 16, 1, 16 + 4096);  // headroom and data are ours to write
  a->len = 1;
  b->len = 2;
  pool.put_full(a);
  pool.put_full(b);
  EXPECT_EQ(pool.get_full(), a);
  EXPECT_EQ(pool.get_full(), b);
  pool.put_empty(a);
  pool.put_empty(b);
  EXPECT_NE(pool.get_empty(0), nullptr);
  EXPECT_NE(pool.get_empty(0), nullptr);
  EXPECT_NE(pool.get_empty(0), nullptr);
  EXPECT_EQ(pool.get_empty(10), nullptr);  // all taken: times out
}

TEST(SlotPool, StagingSlotIsTakenOnlyAtRecordBoundaries) {
  SlotPool pool(2, 100, 0);
  std::atomic<Slot*> taken{nullptr};
  std::thread writer([&] { taken = pool.get_full(); });
  Slot* s = pool.stage_claim();
  ASSERT_NE(s, nullptr);
  pool.stage_commit(30, false);  // mid-record: not for the writer yet
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(taken.load(), nullptr);
  EXPECT_EQ(pool.stage_claim(), s);  // still ours, appended to
  pool.stage_commit(20, true);       // record done: an idle writer takes it
  writer.join();
  EXPECT_EQ(taken.load(), s);
  EXPECT_EQ(s->len, 50u);
  pool.put_empty(s);
}

TEST(SlotPool, FullStagingSlotIsQueuedAndFlushKeepsOrder) {
  SlotPool pool(3, 100, 0);
  Slot* s1 = pool.stage_claim();
  pool.stage_commit(100, false);  // full: queued at once, mid-record or not
  Slot* s2 = pool.stage_claim();
  EXPECT_NE(s1, s2);
  pool.stage_commit(5, false);
  pool.stage_flush();
  EXPECT_EQ(pool.get_full(), s1);
  EXPECT_EQ(pool.get_full(), s2);
  EXPECT_EQ(s2->len, 5u);
}

TEST(SlotPool, CancelWakesEveryWaiter) {
  SlotPool pool(1, 100, 0);
  Slot* only = pool.get_empty();
  ASSERT_NE(only, nullptr);
  std::thread a([&] { EXPECT_EQ(pool.get_empty(), nullptr); });
  std::thread b([&] { EXPECT_EQ(pool.get_full(), nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pool.cancel();
  a.join();
  b.join();
  EXPECT_EQ(pool.stage_claim(), nullptr);
}

}  // namespace
