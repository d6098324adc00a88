#include "ring/ring_channel.h"

#include <atomic>
#include <cerrno>
#include <cstring>

#include "util/misc.h"
#include "util/schedule.h"
#include "util/user_copy.h"

namespace rdmashim {
namespace {

struct PutArgs {
  Link* link;
  uint64_t off;
  const void* src;
  size_t len;
};

void do_put(void* arg) {
  auto* a = static_cast<PutArgs*>(arg);
  a->link->put(a->off, a->src, a->len);
}

}  // namespace

namespace {

constexpr uint64_t kFirstLap = 1024 * 1024;

unsigned log2_of(uint64_t pow2) { return static_cast<unsigned>(__builtin_ctzll(pow2)); }

// The link's tx limit as a power of two within the ring.
uint64_t own_limit(const Link& link) {
  uint64_t size = link.ring_size(), limit = link.tx_limit();
  if (limit == 0 || limit >= size) return size;
  return uint64_t{1} << (63 - __builtin_clzll(limit));
}

}  // namespace

RingChannel::RingChannel(Link& link)
    : link_(link),
      size_(link.ring_size()),
      mask_(link.ring_size() - 1),
      limit_(own_limit(link)),
      tx_lap_(limit_),
      elastic_(link.elastic()),
      maintained_(link.maintained()),
      first_lap_(limit_ < kFirstLap ? limit_ : kFirstLap) {}

void RingChannel::publish_map() { link_.publish_map(uint64_t{log2_of(tx_lap_)} << 32 | (tx_base_ & mask_)); }

void RingChannel::restart_lap() {
  RDMASHIM_SCHED_POINT(kRingShrink);  // the reader drained: the old lap is retired
  tx_base_ = tx_tail_;
  tx_lap_ = first_lap_;
  publish_map();
}

// Full lap, consumer not draining: double it. Pending bytes keep their
// offsets: those that wrapped to the lap's start are copied past its end.
void RingChannel::grow_lap() {
  const uint64_t lap = tx_lap_, pending = tx_tail_ - tx_head_;
  const uint64_t at = (tx_head_ - tx_base_) & (lap - 1);
  const uint64_t wrapped = at + pending > lap ? at + pending - lap : 0;
  if (wrapped > 0) link_.copy_tx(lap, 0, static_cast<size_t>(wrapped));
  tx_base_ = tx_head_ - at;
  tx_lap_ = lap * 2;
  if (lap + wrapped > tx_dirty_) tx_dirty_ = lap + wrapped;
  RDMASHIM_SCHED_POINT(kRingGrow);  // wrapped bytes copied, the new map not yet announced
  publish_map();
  // The map before any byte we write under it (a reader re-checks the map).
  std::atomic_thread_fence(std::memory_order_release);
}

void RingChannel::resync_rx() {
  rx_head_ = link_.own_head();
  rx_tail_ = rx_head_;
}

void RingChannel::resync_tx() {
  tx_tail_ = link_.own_tail();
  if (elastic_) {
    uint64_t word = link_.own_map();
    unsigned lg = static_cast<unsigned>(word >> 32);
    tx_lap_ = word == 0 ? limit_ : uint64_t{1} << (lg < 63 ? lg : 0);
    if (tx_lap_ > limit_ || tx_lap_ < first_lap_) tx_lap_ = limit_;
    tx_base_ = word & mask_;
  }
  tx_head_ = 0;  // refreshed (and checked) from the peer by the next writable()
}

ssize_t RingChannel::writable() {
  uint64_t head = link_.peer_head();
  // Credit only moves forward and never past what we produced.
  if (RDMASHIM_UNLIKELY(head < tx_head_ || head > tx_tail_)) return -EPROTO;
  tx_head_ = head;
  const uint64_t pending = tx_tail_ - tx_head_;
  uint64_t room = pending < limit_ ? limit_ - pending : 0;
  if (room > 0) {
    size_t staged = link_.put_room();  // an asynchronous link's staging may be the limit
    if (staged < room) room = staged;
  }
  return static_cast<ssize_t>(room);
}

ssize_t RingChannel::readable() {
  uint64_t tail = link_.peer_tail();
  // Production only moves forward and never more than a ring ahead of us.
  if (RDMASHIM_UNLIKELY(tail < rx_tail_ || tail - rx_head_ > size_)) return -EPROTO;
  rx_tail_ = tail;
  return static_cast<ssize_t>(rx_tail_ - rx_head_);
}

ssize_t RingChannel::lap_room() {
  ssize_t room = writable();
  if (room <= 0 || !elastic_) return room;
  return static_cast<ssize_t>(tx_lap_ - (tx_tail_ - tx_head_));
}

ssize_t RingChannel::write(const iovec* iov, int iovcnt, size_t skip, bool may_grow) {
  ssize_t room = writable();
  if (room <= 0) return room;
  if (elastic_) {
    // The consumer drained everything: a first lap from the ring's start, so
    // a stream that keeps draining stays in the same few (cache-hot) pages.
    if (tx_head_ == tx_tail_ && (tx_base_ != tx_tail_ || tx_lap_ != first_lap_)) restart_lap();
    if (tx_tail_ - tx_head_ >= tx_lap_) {
      if (!may_grow || tx_lap_ >= limit_) return 0;
      grow_lap();
    }
    room = static_cast<ssize_t>(tx_lap_ - (tx_tail_ - tx_head_));
  }
  const uint64_t lap = tx_lap_;
  size_t left = static_cast<size_t>(room);
  size_t done = 0;
  for (int i = 0; i < iovcnt && left > 0; ++i) {
    size_t len = iov[i].iov_len;
    const auto* src = static_cast<const unsigned char*>(iov[i].iov_base);
    if (skip >= len) {
      skip -= len;
      continue;
    }
    src += skip;
    len -= skip;
    skip = 0;
    if (len > left) len = left;
    // At most two pieces: up to the end of the lap, then from its start.
    while (len > 0) {
      uint64_t off = (tx_tail_ - tx_base_) & (lap - 1);
      size_t piece = static_cast<size_t>(lap - off);
      if (piece > len) piece = len;
      if (off + piece > tx_dirty_) tx_dirty_ = off + piece;
      // The source is the application's: a bad pointer is EFAULT, not a crash.
      PutArgs a{&link_, off, src, piece};
      if (!guarded_user_access(src, piece, do_put, &a)) {
        if (done > 0) link_.publish_tail(tx_tail_);
        return done > 0 ? static_cast<ssize_t>(done) : -EFAULT;
      }
      src += piece;
      len -= piece;
      left -= piece;
      done += piece;
      tx_tail_ += piece;
      if (len > 0) RDMASHIM_SCHED_POINT(kRingWrapWrite);
    }
  }
  if (done > 0) {
    RDMASHIM_SCHED_POINT(kRingPublishTail);
    link_.publish_tail(tx_tail_);
  }
  return static_cast<ssize_t>(done);
}

ssize_t RingChannel::read(const iovec* iov, int iovcnt, bool peek) {
  ssize_t avail = readable();
  if (avail <= 0) return avail;
  const unsigned char* data = elastic_ ? link_.rx_data() : nullptr;  // else rx_span() per piece
  // Read after the tail (readable()): the map that placed these bytes. A
  // hostile map only garbles the peer's own bytes; offsets stay in bounds.
  uint64_t map = elastic_ ? link_.peer_map() : 0;
  size_t done = 0;
  uint64_t pos = rx_head_;
  for (int attempt = 0;; ++attempt) {
    unsigned lg = static_cast<unsigned>(map >> 32);
    const uint64_t lap_mask = map == 0 || lg >= 63 || (uint64_t{1} << lg) > size_ ? mask_ : (uint64_t{1} << lg) - 1;
    const uint64_t base = map & mask_;
    pos = rx_head_;
    size_t left = static_cast<size_t>(avail);
    done = 0;
    for (int i = 0; i < iovcnt && left > 0; ++i) {
      auto* dst = static_cast<unsigned char*>(iov[i].iov_base);
      size_t len = iov[i].iov_len < left ? iov[i].iov_len : left;
      while (len > 0) {
        const unsigned char* from;
        size_t piece;
        if (elastic_) {
          uint64_t off = (pos - base) & lap_mask;
          from = data + off;
          piece = static_cast<size_t>(lap_mask + 1 - off);
        } else {
          from = link_.rx_span(pos, &piece);  // a fixed ring, or verbs regions
        }
        if (piece > len) piece = len;
        if (!copy_user(dst, from, piece, dst)) {
          left = 0;  // what was copied before the fault counts; the rest stays
          if (done == 0) return -EFAULT;
          break;
        }
        dst += piece;
        len -= piece;
        left -= piece;
        done += piece;
        pos += piece;
        if (len > 0) RDMASHIM_SCHED_POINT(kRingWrapRead);
      }
    }
    if (!elastic_) break;
    // The lap grew while we copied: what we read at its old place may be
    // overwritten already; the new map places every pending byte.
    std::atomic_thread_fence(std::memory_order_acquire);
    uint64_t again = link_.peer_map();
    if (again == map || attempt == 8) break;
    map = again;
  }
  if (!peek && done > 0) {
    RDMASHIM_SCHED_POINT(kRingPublishHead);
    rx_head_ = pos;
    link_.publish_head(rx_head_);
  }
  return static_cast<ssize_t>(done);
}

ssize_t RingChannel::discard(size_t n) {
  ssize_t avail = readable();
  if (avail <= 0) return avail;
  size_t k = static_cast<size_t>(avail) < n ? static_cast<size_t>(avail) : n;
  if (k > 0) {
    rx_head_ += k;
    link_.publish_head(rx_head_);
  }
  return static_cast<ssize_t>(k);
}

// Called on the way to sleep or close, never per write: only when the
// consumer published head == tail is no byte of the ring needed, and only we
// write it, so nothing can race with the hole punch.
bool RingChannel::release_tx() {
  if (!elastic_ || tx_dirty_ == 0) return true;
  if (writable() < 0 || tx_head_ != tx_tail_) return false;
  restart_lap();  // the next write starts at the ring's start
  constexpr size_t kPage = 4096;
  size_t len = (tx_dirty_ + kPage - 1) & ~(kPage - 1);
  RDMASHIM_SCHED_POINT(kRingShrink);  // the pages about to be given back
  link_.release_tx(len < size_ ? len : size_);
  tx_dirty_ = 0;
  return true;
}

void RingChannel::release_rx() {
  if (elastic_) link_.release_rx(size_);
}

}  // namespace rdmashim
