// The elastic verbs regions protocol (core/verbs/regions.h), run between a
// simulated producer and consumer: a queue per direction in QP order, an
// emulated NIC that places a WRITE only when it is delivered and refuses any
// outside a live registration (as an rkey check would), fresh regions full of
// garbage, retired ones scribbled before they are freed. Random write and
// read sizes, grows on pressure and shrinks when drained at random moments,
// per seed; every byte checked. Then hostile records, refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "ring/ring_channel.h"
#include "verbs/regions.h"

namespace rdmashim::verbs {
namespace {

unsigned char pattern(uint64_t pos) { return static_cast<unsigned char>((pos * 2654435761u) >> 13); }

struct Msg {
  enum Kind { kData, kTail, kCredit, kControl } kind;
  uint32_t rkey = 0;
  uint64_t addr = 0;
  std::vector<unsigned char> bytes;
  uint64_t pos = 0;  // tail or credit
  Ctl ctl{};
};

class Sim {
 public:
  Sim(uint32_t seed, size_t ring, size_t start) : rng_(seed), ring_(ring), start_(start) {
    Buffer first = reg(start);
    rx_.init(first, start, ring);
    tx_.init(reinterpret_cast<uintptr_t>(first.data), rkey_of(first), start, ring);
  }
  ~Sim() {
    for (auto& [key, b] : live_) free(b.data);
  }

  void run(uint64_t total) {
    while (head_ < total) {
      switch (rng_() % 8) {
        case 0:
        case 1:
          if (tail_ < total) produce(total);
          break;
        case 2:
          deliver_to_consumer();
          break;
        case 3:
        case 4:
          consume();
          break;
        case 5:
          deliver_to_producer();
          break;
        case 6:
          consumer_maintain();
          break;
        case 7:
          producer_maintain();
          break;
      }
      if (tail_ >= total) {  // the end: everything flows
        deliver_to_consumer();
        deliver_to_producer();
      }
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
  }

  int grows = 0, shrinks = 0, switches = 0;
  size_t peak_registered = 0;

 private:
  uint32_t rkey_of(const Buffer& b) {
    for (auto& [key, l] : live_) {
      if (l.data == b.data) return key;
    }
    return 0;
  }
  Buffer reg(size_t size) {
    Buffer b{malloc(size), size, nullptr, true};
    memset(b.data, 0xEE, size);  // garbage until the producer's bytes land
    live_[++next_rkey_] = b;
    registered_ += size;
    if (registered_ > peak_registered) peak_registered = registered_;
    return b;
  }
  void dereg(const Buffer& b) {
    for (auto it = live_.begin(); it != live_.end(); ++it) {
      if (it->second.data == b.data) {
        ASSERT_EQ(it->second.size, b.size);
        memset(b.data, 0xDD, b.size);
        free(b.data);
        registered_ -= b.size;
        live_.erase(it);
        return;
      }
    }
    FAIL() << "giving back a region that is not registered";
  }

  void produce(uint64_t total) {
    uint64_t ring_room = ring_ - (tail_ - credit_);
    uint64_t room = std::min(ring_room, tx_.room(credit_, tail_));
    if (room == 0) {
      Ctl c{};
      if (ring_room > 0 && tx_.take_pressure(&c)) to_consumer_.push_back({Msg::kControl, 0, 0, {}, 0, c});
      return;
    }
    uint64_t n = std::min<uint64_t>({room, total - tail_, 1 + rng_() % (rng_() % 4 == 0 ? ring_ : 3000)});
    uint64_t pos = tail_;
    while (pos < tail_ + n) {  // the pieces of one publish: at most two
      uint64_t piece = std::min<uint64_t>(tail_ + n - pos, tx_.contiguous(pos));
      Msg m{Msg::kData, tx_.rkey(), tx_.addr_of(pos), std::vector<unsigned char>(piece), 0, {}};
      for (uint64_t i = 0; i < piece; ++i) m.bytes[i] = pattern(pos + i);
      to_consumer_.push_back(std::move(m));
      pos += piece;
    }
    tail_ += n;
    to_consumer_.push_back({Msg::kTail, 0, 0, {}, tail_, {}});
  }
  void producer_maintain() {
    // Between two posts, the producer adopts what was offered (a shrink too:
    // here nothing is staged and unposted).
    if (!tx_.offer_pending()) return;
    Ctl s = tx_.adopt(tail_);
    ++switches;
    to_consumer_.push_back({Msg::kControl, 0, 0, {}, 0, s});
  }
  void deliver_to_consumer() {
    for (int k = static_cast<int>(rng_() % 6); k >= 0 && !to_consumer_.empty(); --k) {
      Msg m = std::move(to_consumer_.front());
      to_consumer_.pop_front();
      if (m.kind == Msg::kData) {
        auto it = live_.find(m.rkey);
        ASSERT_NE(it, live_.end()) << "a WRITE with a retired rkey";
        uint64_t lo = reinterpret_cast<uintptr_t>(it->second.data);
        ASSERT_TRUE(m.addr >= lo && m.addr + m.bytes.size() <= lo + it->second.size) << "a WRITE outside its region";
        memcpy(reinterpret_cast<void*>(m.addr), m.bytes.data(), m.bytes.size());
      } else if (m.kind == Msg::kTail) {
        peer_tail_ = m.pos;
      } else if (m.ctl.kind == kCtlSwitch) {
        ASSERT_TRUE(rx_.on_switch(m.ctl, peer_tail_));
      } else if (m.ctl.kind == kCtlPressure) {
        rx_.on_pressure(m.ctl);
      }
    }
  }
  void consume() {
    uint64_t avail = peer_tail_ - head_;
    if (avail == 0) return;
    uint64_t n = std::min<uint64_t>(avail, 1 + rng_() % (rng_() % 4 == 0 ? ring_ : 4000));
    for (uint64_t pos = head_; pos < head_ + n;) {
      size_t contig = 0;
      const unsigned char* p = rx_.at(pos, &contig);
      uint64_t piece = std::min<uint64_t>(contig, head_ + n - pos);
      ASSERT_GT(piece, 0u) << "no byte at position " << pos;
      for (uint64_t i = 0; i < piece; ++i) {
        ASSERT_EQ(p[i], pattern(pos + i)) << "byte at position " << pos + i;
      }
      pos += piece;
    }
    head_ += n;
    Buffer old;
    if (rx_.retire(head_, &old)) dereg(old);
    if (rng_() % 3 == 0 || head_ == peer_tail_) to_producer_.push_back({Msg::kCredit, 0, 0, {}, head_, {}});
  }
  void consumer_maintain() {
    Buffer old;
    if (rx_.retire(head_, &old)) dereg(old);
    if (!rx_.can_offer()) return;
    size_t size = 0;
    if (rx_.pressure()) {
      size = rx_.grown_size();
      ++grows;
    } else if (head_ == peer_tail_ && rx_.size() > start_ && rng_() % 4 == 0) {
      size = start_;
      ++shrinks;
    } else {
      return;
    }
    Buffer b = reg(size);
    Ctl c = rx_.offer(b);
    c.rkey = rkey_of(b);
    to_producer_.push_back({Msg::kControl, 0, 0, {}, 0, c});
  }
  void deliver_to_producer() {
    for (int k = static_cast<int>(rng_() % 4); k >= 0 && !to_producer_.empty(); --k) {
      Msg m = std::move(to_producer_.front());
      to_producer_.pop_front();
      if (m.kind == Msg::kCredit) {
        credit_ = std::max(credit_, m.pos);
      } else {
        ASSERT_TRUE(tx_.offer(m.ctl));
        // A grow is adopted at once (the producer is waiting for it).
        if (tx_.offered_size() >= tx_.size() && rng_() % 2) producer_maintain();
      }
    }
  }

  std::mt19937 rng_;
  size_t ring_, start_;
  RxRegions rx_;
  TxRegions tx_;
  std::map<uint32_t, Buffer> live_;
  uint32_t next_rkey_ = 0;
  size_t registered_ = 0;
  std::deque<Msg> to_consumer_, to_producer_;
  uint64_t tail_ = 0, credit_ = 0;     // producer
  uint64_t head_ = 0, peer_tail_ = 0;  // consumer
};

TEST(VerbsRegions, RandomGrowAndShrinkKeepEveryByte) {
  int grows = 0, shrinks = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    std::mt19937 pick(seed);
    size_t ring = size_t{64} << (10 + pick() % 6);  // 64 KiB .. 2 MiB
    size_t start = size_t{4} << (10 + pick() % 4);  // 4 .. 32 KiB
    if (start > ring) start = ring;
    Sim sim(seed, ring, start);
    sim.run(uint64_t{8} << 20);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "seed " << seed;
    // Two regions at most at any time, each within the ring.
    EXPECT_LE(sim.peak_registered, 2 * ring) << "seed " << seed;
    grows += sim.grows;
    shrinks += sim.shrinks;
  }
  EXPECT_GT(grows, 20);
  EXPECT_GT(shrinks, 20);
}

// The same protocol under the ring itself: a Link whose rx ring is a chain
// of regions (rx_span) and whose producer writes where the peer's current
// region says, driven through RingChannel's write and read with iovecs.
class RegionLink final : public Link {
 public:
  RegionLink(std::mt19937& rng, size_t ring, size_t start) : rng_(rng), ring_(ring), start_(start) {
    Buffer first = reg(start);
    rx_.init(first, start, ring);
    tx_.init(reinterpret_cast<uintptr_t>(first.data), key(first), start, ring);
  }
  ~RegionLink() override {
    for (auto& [k, b] : live_) free(b.data);
  }
  size_t ring_size() const override { return ring_; }
  void put(uint64_t, const void* src, size_t len) override {
    auto* p = static_cast<const unsigned char*>(src);
    staged_.insert(staged_.end(), p, p + len);
  }
  void publish_tail(uint64_t tail) override {
    uint64_t pos = own_tail_;
    size_t at = 0;
    while (pos < tail) {  // into the region current now, as VerbsLink posts
      uint64_t piece = std::min<uint64_t>(tail - pos, tx_.contiguous(pos));
      to_rx_.push_back({Msg::kData, tx_.rkey(), tx_.addr_of(pos),
                        std::vector<unsigned char>(staged_.begin() + at, staged_.begin() + at + piece), 0, {}});
      pos += piece;
      at += piece;
    }
    staged_.clear();
    own_tail_ = tail;
    to_rx_.push_back({Msg::kTail, 0, 0, {}, tail, {}});
  }
  uint64_t peer_head() override { return credit_; }
  const unsigned char* rx_data() const override {
    size_t n;
    return rx_.at(own_head_, &n);
  }
  const unsigned char* rx_span(uint64_t pos, size_t* contiguous) const override { return rx_.at(pos, contiguous); }
  uint64_t peer_tail() override { return peer_tail_; }
  void publish_head(uint64_t head) override {
    own_head_ = head;
    Buffer old;
    if (rx_.retire(head, &old)) dereg(old);
    to_tx_.push_back({Msg::kCredit, 0, 0, {}, head, {}});
  }
  uint64_t own_tail() const override { return own_tail_; }
  uint64_t own_head() const override { return own_head_; }
  int wait_fd() const override { return -1; }
  void prepare_sleep(unsigned) override {}
  void finish_sleep(unsigned, bool) override {}
  size_t put_room() override {
    uint64_t room = tx_.room(credit_, own_tail_);
    Ctl c{};
    if (room == 0 && tx_.take_pressure(&c)) to_rx_.push_back({Msg::kControl, 0, 0, {}, 0, c});
    return static_cast<size_t>(room);
  }

  // The NIC and the peers' maintenance, one random step.
  void step() {
    switch (rng_() % 4) {
      case 0:
        for (int k = static_cast<int>(rng_() % 8); k >= 0 && !to_rx_.empty(); --k) deliver_rx();
        break;
      case 1:
        for (int k = static_cast<int>(rng_() % 4); k >= 0 && !to_tx_.empty(); --k) deliver_tx();
        break;
      case 2:
        if (rx_.can_offer() && (rx_.pressure() || (own_head_ == peer_tail_ && rx_.size() > start_ && rng_() % 3 == 0))) {
          shrinks += !rx_.pressure();
          Buffer b = reg(rx_.pressure() ? rx_.grown_size() : start_);
          Ctl c = rx_.offer(b);
          c.rkey = key(b);
          to_tx_.push_back({Msg::kControl, 0, 0, {}, 0, c});
        }
        break;
      case 3:
        if (tx_.offer_pending()) {  // between two writes: nothing staged
          grows += tx_.offered_size() > tx_.size();
          to_rx_.push_back({Msg::kControl, 0, 0, {}, 0, tx_.adopt(own_tail_)});
        }
        break;
    }
  }
  int grows = 0, shrinks = 0;

 private:
  uint32_t key(const Buffer& b) const {
    for (auto& [k, l] : live_) {
      if (l.data == b.data) return k;
    }
    return 0;
  }
  Buffer reg(size_t size) {
    Buffer b{malloc(size), size, nullptr, true};
    memset(b.data, 0xEE, size);
    live_[++next_key_] = b;
    return b;
  }
  void dereg(const Buffer& b) {
    uint32_t k = key(b);
    ASSERT_NE(k, 0u);
    memset(b.data, 0xDD, b.size);
    free(b.data);
    live_.erase(k);
  }
  void deliver_rx() {
    Msg m = std::move(to_rx_.front());
    to_rx_.pop_front();
    if (m.kind == Msg::kData) {
      auto it = live_.find(m.rkey);
      ASSERT_NE(it, live_.end());
      uint64_t lo = reinterpret_cast<uintptr_t>(it->second.data);
      ASSERT_TRUE(m.addr >= lo && m.addr + m.bytes.size() <= lo + it->second.size);
      memcpy(reinterpret_cast<void*>(m.addr), m.bytes.data(), m.bytes.size());
    } else if (m.kind == Msg::kTail) {
      peer_tail_ = m.pos;
    } else if (m.ctl.kind == kCtlSwitch) {
      ASSERT_TRUE(rx_.on_switch(m.ctl, peer_tail_));
    } else {
      rx_.on_pressure(m.ctl);
    }
  }
  void deliver_tx() {
    Msg m = std::move(to_tx_.front());
    to_tx_.pop_front();
    if (m.kind == Msg::kCredit) {
      credit_ = std::max(credit_, m.pos);
    } else {
      ASSERT_TRUE(tx_.offer(m.ctl));
    }
  }

  std::mt19937& rng_;
  size_t ring_, start_;
  RxRegions rx_;
  TxRegions tx_;
  std::map<uint32_t, Buffer> live_;
  uint32_t next_key_ = 0;
  std::vector<unsigned char> staged_;
  std::deque<Msg> to_rx_, to_tx_;
  uint64_t own_tail_ = 0, credit_ = 0, own_head_ = 0, peer_tail_ = 0;
};

TEST(VerbsRegions, RingChannelOverGrowingAndShrinkingRegions) {
  int grows = 0, shrinks = 0;
#if defined(__SANITIZE_THREAD__)
  constexpr uint32_t kSeeds = 8;  // TSan runs the ring code ~50x slower: 30 seeds outlast the timeout
#else
  constexpr uint32_t kSeeds = 30;
#endif
  for (uint32_t seed = 1; seed <= kSeeds; ++seed) {
    std::mt19937 rng(seed);
    size_t ring = size_t{64} << (10 + rng() % 5);
    size_t start = std::min(ring, size_t{4} << (10 + rng() % 3));
    RegionLink link(rng, ring, start);
    RingChannel tx(link), rx(link);  // one end writes, the other reads
    const uint64_t total = uint64_t{4} << 20;
    std::vector<unsigned char> src(ring), dst(ring);
    uint64_t sent = 0, got = 0;
    while (got < total) {
      if (sent < total && rng() % 2) {
        size_t n = std::min<uint64_t>(total - sent, 1 + rng() % (rng() % 4 ? 5000 : ring));
        for (size_t i = 0; i < n; ++i) src[i] = pattern(sent + i);
        size_t cut = rng() % (n + 1);
        iovec iov[2] = {{src.data(), cut}, {src.data() + cut, n - cut}};
        ssize_t w = tx.write(iov, 2);
        ASSERT_GE(w, 0) << "seed " << seed;
        sent += static_cast<uint64_t>(w);
      }
      if (rng() % 2) {
        size_t n = 1 + rng() % (rng() % 4 ? 7000 : ring);
        size_t cut = rng() % (n + 1);
        iovec iov[2] = {{dst.data(), cut}, {dst.data() + cut, n - cut}};
        ssize_t r = rx.read(iov, 2, rng() % 8 == 0);
        ASSERT_GE(r, 0) << "seed " << seed;
        for (ssize_t i = 0; i < r; ++i) ASSERT_EQ(dst[i], pattern(got + i)) << "seed " << seed << " position " << got + i;
        if (rx.rx_position() > got) got = rx.rx_position();
      }
      link.step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "seed " << seed;
    }
    grows += link.grows;
    shrinks += link.shrinks;
  }
  EXPECT_GT(grows, kSeeds / 3);
  EXPECT_GT(shrinks, kSeeds / 3);
}

TEST(VerbsRegions, ProducerRefusesHostileOffers) {
  TxRegions tx;
  tx.init(0x10000, 7, 4096, 1 << 20);
  const Ctl good{kCtlOffer, 1, 0x200000, 9, 1 << 16, 0};
  Ctl c = good;
  c.gen = 2;  // skips a generation
  EXPECT_FALSE(tx.offer(c));
  c = good;
  c.gen = 0;  // the current one again
  EXPECT_FALSE(tx.offer(c));
  c = good;
  c.size = 2 << 20;  // more than the ring
  EXPECT_FALSE(tx.offer(c));
  c = good;
  c.size = 3 << 12;  // not a power of two
  EXPECT_FALSE(tx.offer(c));
  c = good;
  c.size = 1024;  // below a page
  EXPECT_FALSE(tx.offer(c));
  c = good;
  c.addr = UINT64_MAX - 100;  // wraps the address space
  EXPECT_FALSE(tx.offer(c));
  EXPECT_FALSE(tx.offer_pending());
  EXPECT_EQ(tx.room(0, 0), 4096u);
  ASSERT_TRUE(tx.offer(good));
  EXPECT_FALSE(tx.offer(good));  // a second one before the first was adopted
  Ctl s = tx.adopt(1000);
  EXPECT_EQ(s.kind, kCtlSwitch);
  EXPECT_EQ(s.gen, 1u);
  EXPECT_EQ(s.pos, 1000u);
  EXPECT_EQ(tx.addr_of(1000), 0x200000u + 1000);
  EXPECT_EQ(tx.room(0, 1000), uint64_t{1} << 16);  // the old region's bytes do not count
  EXPECT_EQ(tx.room(2000, 1000 + (1 << 16)), 1000u);
}

TEST(VerbsRegions, ConsumerRefusesHostileSwitches) {
  std::vector<unsigned char> a(4096), b(16384);
  RxRegions rx;
  rx.init(Buffer{a.data(), a.size(), nullptr, true}, a.size(), 1 << 20);
  EXPECT_FALSE(rx.on_switch(Ctl{kCtlSwitch, 1, 0, 0, 0, 0}, 0));  // nothing was offered
  ASSERT_TRUE(rx.can_offer());
  Ctl o = rx.offer(Buffer{b.data(), b.size(), nullptr, true});
  EXPECT_EQ(o.gen, 1u);
  EXPECT_FALSE(rx.can_offer());
  EXPECT_FALSE(rx.on_switch(Ctl{kCtlSwitch, 2, 0, 0, 0, 500}, 500));  // not the offered generation
  EXPECT_FALSE(rx.on_switch(Ctl{kCtlSwitch, 1, 0, 0, 0, 400}, 500));  // not where the stream is
  EXPECT_FALSE(rx.on_switch(Ctl{kCtlSwitch, 1, 0, 0, 0, 600}, 500));
  EXPECT_FALSE(rx.on_pressure(Ctl{kCtlPressure, 5, 0, 0, 0, 0}));  // stale or made up: ignored
  ASSERT_TRUE(rx.on_switch(Ctl{kCtlSwitch, 1, 0, 0, 0, 500}, 500));
  EXPECT_FALSE(rx.on_switch(Ctl{kCtlSwitch, 1, 0, 0, 0, 500}, 500));  // twice
  size_t n = 0;
  EXPECT_EQ(rx.at(499, &n), a.data() + 499);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(rx.at(500, &n), b.data() + 500);
  Buffer old;
  EXPECT_FALSE(rx.retire(499, &old));  // the old region still holds a byte
  ASSERT_TRUE(rx.retire(500, &old));
  EXPECT_EQ(old.data, a.data());
  EXPECT_EQ(rx.size(), b.size());
  EXPECT_TRUE(rx.can_offer());
}

}  // namespace
}  // namespace rdmashim::verbs
