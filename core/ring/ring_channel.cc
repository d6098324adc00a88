#include "ring/ring_channel.h"

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

RingChannel::RingChannel(Link& link)
    : link_(link), size_(link.ring_size()), mask_(link.ring_size() - 1) {}

void RingChannel::resync_rx() {
  rx_head_ = link_.own_head();
  rx_tail_ = rx_head_;
}

void RingChannel::resync_tx() {
  tx_tail_ = link_.own_tail();
  tx_head_ = 0;  // refreshed (and checked) from the peer by the next writable()
}

ssize_t RingChannel::writable() {
  uint64_t head = link_.peer_head();
  // Credit only moves forward and never past what we produced.
  if (RDMASHIM_UNLIKELY(head < tx_head_ || head > tx_tail_)) return -EPROTO;
  tx_head_ = head;
  return static_cast<ssize_t>(size_ - (tx_tail_ - tx_head_));
}

ssize_t RingChannel::readable() {
  uint64_t tail = link_.peer_tail();
  // Production only moves forward and never more than a ring ahead of us.
  if (RDMASHIM_UNLIKELY(tail < rx_tail_ || tail - rx_head_ > size_)) return -EPROTO;
  rx_tail_ = tail;
  return static_cast<ssize_t>(rx_tail_ - rx_head_);
}

ssize_t RingChannel::write(const iovec* iov, int iovcnt, size_t skip) {
  ssize_t room = writable();
  if (room <= 0) return room;
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
    // At most two pieces: up to the end of the ring, then from its start.
    while (len > 0) {
      uint64_t off = tx_tail_ & mask_;
      size_t piece = static_cast<size_t>(size_ - off);
      if (piece > len) piece = len;
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
  const unsigned char* data = link_.rx_data();
  uint64_t pos = rx_head_;
  size_t left = static_cast<size_t>(avail);
  size_t done = 0;
  for (int i = 0; i < iovcnt && left > 0; ++i) {
    auto* dst = static_cast<unsigned char*>(iov[i].iov_base);
    size_t len = iov[i].iov_len < left ? iov[i].iov_len : left;
    while (len > 0) {
      uint64_t off = pos & mask_;
      size_t piece = static_cast<size_t>(size_ - off);
      if (piece > len) piece = len;
      if (!copy_user(dst, data + off, piece, dst)) {
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

}  // namespace rdmashim
