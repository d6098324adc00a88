// Elastic receive memory for verbs: the registered-memory analogue of the
// shared-memory laps. Pinned pages cannot be given back under a live
// registration (the NIC would write into pages the process no longer sees),
// so the receiver owns a chain of regions, one registration each, and hands
// the producer a new one by generation:
//
//   producer finds its region full, the ring allowing more -> Pressure{gen}
//   consumer registers a bigger region (x4, at most the ring;   -> Offer{gen+1, addr, rkey, size}
//   x16 when it is away: VerbsLink::tend_regions)
//   consumer drained and idle, its region above the start   -> Offer{gen+1, small}
//   producer, between two posts, adopts the offer            -> Switch{gen+1, pos = T}
//   consumer reads positions < T in the old region, >= T in the new one, and
//   deregisters the old one once it consumed T.
//
// Position p lives at offset p mod size of its region. In a region adopted at
// T the producer may write p while p < max(head, T) + size: p overwrites
// p - size only when that was consumed or belongs to the old region. The
// ring's own bound (tail - head <= ring) still holds on top.
//
// Everything the peer sends is checked: an offer must be the next generation,
// a power of two within [kMinRingSize, ring] and not wrap (the NIC enforces
// the rkey: a lying peer only fails its own writes); a switch must name the
// offered generation at exactly the last tail published (messages arrive in
// QP order). Pure: no verbs library needed (tests/unit/verbs_regions_test.cc).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ring/ring_limits.h"
#include "verbs/reg_pool.h"

namespace rdmashim::verbs {

// A connection's first region: small enough that an idle connection pins
// little, large enough that a 64 B ping-pong never waits for credit.
inline constexpr size_t kStartRegion = size_t{256} << 10;

// A control message, one RDMA SEND (little-endian, 32 bytes):
//  0  kind  u32  kCtlOffer | kCtlSwitch | kCtlPressure | kCtlBye
//  4  gen   u32  offer: the offered region's generation; switch: the one
//                switched to; pressure: the one found full
//  8  addr  u64  offer: the region's address (in the consumer's process)
// 16  rkey  u32  offer
// 20  size  u32  offer: its bytes, a power of two
// 24  pos   u64  switch: the first stream position written to `gen`
// kCtlBye (the rest 0): the sender's QP is going away (its connection closed
// for good, or its process exits) and it reads nothing more; sent only to a
// peer whose Params carry kParamsBye.
struct Ctl {
  uint32_t kind;
  uint32_t gen;
  uint64_t addr;
  uint32_t rkey;
  uint32_t size;
  uint64_t pos;
};
static_assert(sizeof(Ctl) == 32);
enum : uint32_t { kCtlOffer = 1, kCtlSwitch = 2, kCtlPressure = 3, kCtlBye = 4 };

// The producer's view of the peer's regions. The owner serializes every call
// but room() (lock-free, from any thread).
class TxRegions {
 public:
  void init(uint64_t addr, uint32_t rkey, size_t size, size_t ring) {
    addr_ = addr;
    rkey_ = rkey;
    ring_ = ring;
    set(0, size);
  }
  // An offer from the peer. False: it breaks the protocol (the link fails).
  bool offer(const Ctl& c) {
    if (has_offer_ || c.gen != gen_ + 1 || !valid_ring_size(c.size) || c.size > ring_ ||
        c.addr > UINT64_MAX - c.size) {
      return false;
    }
    offer_ = c;
    has_offer_ = true;
    return true;
  }
  bool offer_pending() const { return has_offer_; }
  size_t offered_size() const { return has_offer_ ? offer_.size : 0; }
  // Positions from `at` on (the end of what was posted) go to the offered
  // region: the Switch message to post before any of them.
  Ctl adopt(uint64_t at) {
    has_offer_ = false;
    gen_ = offer_.gen;
    addr_ = offer_.addr;
    rkey_ = offer_.rkey;
    pressured_ = false;
    set(at, offer_.size);
    return Ctl{kCtlSwitch, gen_, 0, 0, 0, at};
  }
  // Bytes the producer may write at tail with the consumer's credit at head.
  uint64_t room(uint64_t head, uint64_t tail) const {
    uint64_t w = word_.load(std::memory_order_acquire);
    uint64_t start = w >> 6, size = uint64_t{1} << (w & 63);
    uint64_t limit = (head > start ? head : start) + size;
    return limit > tail ? limit - tail : 0;
  }
  // Where position pos goes, and how many bytes from there are contiguous.
  uint64_t addr_of(uint64_t pos) const { return addr_ + (pos & (size_ - 1)); }
  uint64_t contiguous(uint64_t pos) const { return size_ - (pos & (size_ - 1)); }
  uint64_t base_addr() const { return addr_; }
  uint32_t rkey() const { return rkey_; }
  uint32_t gen() const { return gen_; }
  size_t size() const { return size_; }
  // Whether to report pressure now (room() found 0 while the ring allows
  // more): once per generation, below the ring, nothing offered yet.
  bool take_pressure(Ctl* out) {
    if (pressured_ || has_offer_ || size_ >= ring_) return false;
    pressured_ = true;
    *out = Ctl{kCtlPressure, gen_, 0, 0, 0, 0};
    return true;
  }

 private:
  void set(uint64_t start, size_t size) {
    size_ = size;
    word_.store(start << 6 | static_cast<unsigned>(__builtin_ctzll(size)), std::memory_order_release);
  }
  uint64_t addr_ = 0;
  uint32_t rkey_ = 0;
  uint32_t gen_ = 0;
  size_t size_ = 0;
  size_t ring_ = 0;
  bool has_offer_ = false;
  bool pressured_ = false;
  Ctl offer_{};
  std::atomic<uint64_t> word_{0};  // start << 6 | log2(size): room() from any thread
};

// The consumer's regions: the current one and at most one offered. Threads:
// at() and retire() are the reader's; offer() and retire() run under the
// owner's offer lock; on_switch() and on_pressure() come from completion
// polling. The state word orders them: next_ is written only while nothing
// is offered and read only once the switch is known.
class RxRegions {
 public:
  void init(const Buffer& first, size_t usable, size_t ring) {
    cur_ = first;
    cur_.size = usable;  // a client uses the first `usable` bytes of what it registered
    registered_ = first.size;
    ring_ = ring;
    cur_size_.store(usable, std::memory_order_relaxed);
  }
  const unsigned char* at(uint64_t pos, size_t* contiguous) const {
    const Buffer* r = &cur_;
    uint64_t limit = UINT64_MAX;
    if (__builtin_expect(state_.load(std::memory_order_acquire) == kSwitched, 0)) {
      if (pos >= switch_at_) {
        r = &next_;
      } else {
        limit = switch_at_ - pos;
      }
    }
    uint64_t off = pos & (r->size - 1), n = r->size - off;
    *contiguous = static_cast<size_t>(n < limit ? n : limit);
    return static_cast<const unsigned char*>(r->data) + off;
  }
  bool can_offer() const { return state_.load(std::memory_order_acquire) == kNone; }
  uint32_t gen() const { return gen_.load(std::memory_order_relaxed); }
  size_t size() const { return cur_.size; }
  size_t size_hint() const { return cur_size_.load(std::memory_order_relaxed); }  // any thread
  size_t ring() const { return ring_; }
  // The size to grow to: x4 (or `factor`), at most the ring.
  size_t grown_size(size_t factor = 4) const { return cur_.size * factor < ring_ ? cur_.size * factor : ring_; }
  // Offer lock held, can_offer(): b becomes the next region.
  Ctl offer(const Buffer& b) {
    next_ = b;
    state_.store(kOffered, std::memory_order_release);
    pressure_.store(false, std::memory_order_relaxed);
    return Ctl{kCtlOffer, gen() + 1, reinterpret_cast<uintptr_t>(b.data), 0, static_cast<uint32_t>(b.size), 0};
  }
  // The producer's switch; peer_tail: the last tail it published. False: a
  // protocol error.
  bool on_switch(const Ctl& c, uint64_t peer_tail) {
    if (state_.load(std::memory_order_acquire) != kOffered || c.gen != gen() + 1 || c.pos != peer_tail) return false;
    switch_at_ = c.pos;
    state_.store(kSwitched, std::memory_order_release);
    return true;
  }
  // Pressure on our current region (stale ones are ignored). True: grow.
  bool on_pressure(const Ctl& c) {
    if (c.gen != gen() || cur_size_hint() >= ring_) return false;
    pressure_.store(true, std::memory_order_relaxed);
    return true;
  }
  bool pressure() const { return pressure_.load(std::memory_order_relaxed); }
  void clear_pressure() { pressure_.store(false, std::memory_order_relaxed); }
  bool switched() const { return state_.load(std::memory_order_acquire) == kSwitched; }
  // Reader (or the offer lock with no reader running): once the consumer is
  // at or past the switch, the old region is returned in *old to give back.
  bool retire(uint64_t head, Buffer* old) {
    if (state_.load(std::memory_order_acquire) != kSwitched || head < switch_at_) return false;
    *old = cur_;
    old->size = registered_;
    cur_ = next_;
    registered_ = next_.size;
    cur_size_.store(cur_.size, std::memory_order_relaxed);
    gen_.store(gen() + 1, std::memory_order_relaxed);
    state_.store(kNone, std::memory_order_release);
    return true;
  }
  // The region offered and not yet switched to, if any (to give back at the end).
  bool offered(Buffer* b) const {
    if (state_.load(std::memory_order_acquire) == kNone) return false;
    *b = next_;
    return true;
  }
  // The current region as registered (to give back at the end).
  Buffer current() const {
    Buffer b = cur_;
    b.size = registered_;
    return b;
  }

 private:
  enum : int { kNone, kOffered, kSwitched };
  size_t cur_size_hint() const { return cur_size_.load(std::memory_order_relaxed); }
  Buffer cur_{}, next_{};
  size_t registered_ = 0;  // cur_'s registered bytes (>= cur_.size)
  size_t ring_ = 0;
  uint64_t switch_at_ = 0;
  std::atomic<int> state_{kNone};
  std::atomic<uint32_t> gen_{0};
  std::atomic<bool> pressure_{false};
  std::atomic<size_t> cur_size_{0};
};

}  // namespace rdmashim::verbs
