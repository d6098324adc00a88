// Leaving the rings: a connection moves back onto its TCP socket mid-stream,
// each direction on its own, with every byte in order.
//
// The sender of a direction stops writing its ring and sends, on the TCP
// socket, Downgrade{position = its tx position, Leave}; whatever it sends
// after that is raw TCP bytes. The receiver reads its ring up to that
// position, then the TCP socket (the raw bytes start right after the frame,
// so no frame is ever read again on that direction). Either side may start:
// its own direction leaves with Leave|Ask, and the peer, seeing Ask, takes
// its own direction off too (without asking back), with its next send: a
// Downgrade only ever goes out ahead of data. When both directions
// left, the connection is passthrough: the hooks skip it, the ring's pages
// are given back. Only between peers that both offered it in the handshake
// (kHelloFlagDowngrade, kAckFlagDowngrade); with an older peer nothing is
// ever sent and downgrade() says -ENOTSUP.
//
// The data path pays nothing for it: the send side looks at one relaxed
// byte (down_want_) per call, the receive side only when its ring is empty.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "conn/connection.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/schedule.h"

namespace rdmashim {

int Connection::downgrade(uint8_t reason) {
  if (!peer_downgrades_.load(std::memory_order_acquire)) return -ENOTSUP;
  if (orphaned_) return -EBUSY;
  {
    std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);
    if (tx.owns_lock() && transport_ && transport_->ever_shared()) return -EBUSY;
  }
  note_reason(reason);
  down_want_.fetch_or(kDownTx | kDownAsk, std::memory_order_relaxed);
  // A writer waiting on a full ring acts on it within kSelfWakeMs (only
  // the peer can ring our doorbell).
  return 0;
}

void Connection::note_reason(uint8_t reason) {
  uint8_t none = 0;
  uint8_t r = reason != 0 ? reason : static_cast<uint8_t>(wire::kDowngradeRequested);
  down_reason_.compare_exchange_strong(none, r, std::memory_order_relaxed);
}

// tx_mu_ held, in a send with bytes to go out right after. Acts on
// down_want_: a direction on the ring leaves it (unless the socket has no
// room for the frame: then at the next step), a framed one asks the peer at
// a frame boundary and goes Plain. Never on its own, as for Switch and
// Plain: a frame landing on a peer's closed socket draws an RST that would
// discard what we have yet to read (tests/interleave 1917); ahead of our own
// data it is no worse than TCP.
void Connection::apply_tx_downgrade() {
  uint8_t want = down_want_.load(std::memory_order_relaxed);
  if (want == 0) return;
  // A side shared with another process (fork) would need every sibling to
  // stop writing the ring first: not yet; that connection keeps its ring.
  if (!peer_downgrades_.load(std::memory_order_relaxed) || tx_shut_.load(std::memory_order_relaxed) ||
      (transport_ && transport_->ever_shared())) {
    down_want_.store(0, std::memory_order_relaxed);
    return;
  }
  uint8_t r = down_reason_.load(std::memory_order_relaxed);
  wire::Downgrade d{};
  d.reason = static_cast<uint8_t>(r & 0x7f);
  if ((want & kDownAsk) && !down_asked_) d.flags |= wire::kDowngradeAsk;  // once is enough
  if (tx_ == Tx::kRing) {
    RDMASHIM_SCHED_POINT(kDowngradeSend);
    flush_tx();  // our ring writes land before the peer reads where they end
    d.position = ring_->tx_position();
    d.flags |= wire::kDowngradeLeave;
  } else if (tx_ == Tx::kFramed) {
    tx_go_plain();  // at our next send, as any fallback
    if (!(d.flags & wire::kDowngradeAsk)) {
      down_want_.store(0, std::memory_order_relaxed);
      return;
    }
    if (tx_hdr_left_ != 0 || tx_frame_left_ != 0) return;  // the ask waits for a frame boundary
  } else {
    down_want_.store(0, std::memory_order_relaxed);  // raw (or undecided): no frame can go
    return;
  }
  int s = send_control(wire::FrameType::kDowngrade, &d, sizeof d);
  if (s == -EAGAIN) return;  // no room for a single byte: the next step tries again
  down_want_.store(0, std::memory_order_relaxed);
  if (s == 0 && (d.flags & wire::kDowngradeAsk)) down_asked_ = true;
  if (s != 0 || !(d.flags & wire::kDowngradeLeave)) return;  // a broken stream: the data path reports it
  tx_ = Tx::kRaw;
  // A new edge for an edge-triggered waiter (hooks_epoll: off the ring, a
  // count that is not 0 is one), and the kernel's answers from now on.
  tx_again_.fetch_add(1, std::memory_order_relaxed);
  tx_ring_.store(false, std::memory_order_release);
  left_ring(kLeftTx);
}

// tx_mu_ held, our direction just left the ring in the middle of a send
// that had put `done` bytes into it: the rest goes out on TCP.
ssize_t Connection::send_after_downgrade(const iovec* iov, int iovcnt, size_t done, int flags) {
  constexpr int kMaxIov = 64;
  iovec part[kMaxIov];
  int n = iov_slice(iov, iovcnt, done, SIZE_MAX, part, kMaxIov);
  if (n == 0) return static_cast<ssize_t>(done);
  ssize_t r = tcp_send(part, n, flags);
  if (r < 0) return done > 0 ? static_cast<ssize_t>(done) : r;
  return static_cast<ssize_t>(done + static_cast<size_t>(r));
}

// rx_mu_ held: the peer's Downgrade frame (read on the TCP side).
void Connection::on_peer_downgrade(const wire::Downgrade& d) {
  RDMASHIM_SCHED_POINT(kDowngradeReceived);
  if (d.flags & wire::kDowngradeAsk) {
    note_reason(static_cast<uint8_t>(0x80 | (d.reason & 0x7f)));
    down_want_.fetch_or(kDownTx, std::memory_order_relaxed);
    // Our next send leaves; a writer waiting for room within kSelfWakeMs.
    // Now: the peer waits for it (fork, exec): at once (handover.cc).
    if (d.flags & wire::kDowngradeNow) answer_ask_now();
  }
  if (!(d.flags & wire::kDowngradeLeave)) return;
  note_reason(static_cast<uint8_t>(0x80 | (d.reason & 0x7f)));
  if (rx_ == Rx::kFramed) {  // never on the ring: the raw bytes follow at once
    rx_ = Rx::kRaw;
    return;
  }
  rx_down_pos_ = d.position;
  rx_leaving_.store(true, std::memory_order_release);
  transport_->mark_rx_left(d.position);  // for siblings after fork: they never see the frame
  (void)finish_rx_downgrade();
}

// rx_mu_ held, rx on the ring, before anything reads the TCP side: a sibling
// process (fork) may have read the peer's Downgrade; the TCP bytes after it
// are then raw, never frames. Only where the side was ever shared.
void Connection::follow_sibling_downgrade() {
  uint64_t pos = 0;
  if (rx_leaving_.load(std::memory_order_relaxed) || !transport_ || !transport_->ever_shared() ||
      !transport_->rx_left(&pos)) {
    return;
  }
  rx_down_pos_ = pos;
  rx_leaving_.store(true, std::memory_order_release);
}

// rx_mu_ held, after the peer's Downgrade: once the ring is read up to its
// end, the direction is raw TCP.
bool Connection::finish_rx_downgrade() {
  if (rx_ != Rx::kRing) return true;
  uint64_t pos = ring_->rx_position();
  if (pos < rx_down_pos_) return false;
  uint64_t tail = ring_->link().peer_tail();
  rx_ = Rx::kRaw;
  if (tail != rx_down_pos_) broken("ring written past its downgrade");
  // A new edge for edge-triggered epoll: rx progress is the count of reads
  // that found EAGAIN again, and one more than any count a look may have
  // taken before the ring (it was the ring's tail + 1 here, which for a ring
  // that carried nothing equalled the count a look took before the Switch:
  // 128 KiB sat unreported on the socket, interleave seed 110).
  rx_again_.fetch_add(1, std::memory_order_relaxed);
  rx_ring_.store(false, std::memory_order_release);
  release_rx_for_good();  // the peer writes our ring no more
  left_ring(kLeftRx);
  return true;
}

// Our ring writes are not confirmed and our QP is about to go (exit, or a
// close that gave up on them): a stopped reader (SIGSTOP, a debugger) posts
// no receives, so they wait in our send queue, retried without end. A
// TCP socket's kernel would still deliver them. So, to a peer that reads
// Downgrade frames, they go on TCP: the link stops (nothing more of ours
// lands in the peer's ring) and says where our stream there ends; then
// Downgrade{Leave, that position} and the bytes from there on, from the
// staging that kept them. The peer reads its ring up to there, then the
// bytes. Whole or not at all: short of that the caller resets, never a
// clean end of a shorter stream.
bool Connection::resend_unconfirmed(int fd) {
  if (!peer_downgrades_.load(std::memory_order_acquire) || tx_ != Tx::kRing ||
      tx_shut_.load(std::memory_order_relaxed) || !ring_) {
    return false;
  }
  constexpr int kStopMs = 500;   // the provider flushes a stopped QP's WRs at once
  constexpr int kSendMs = 1000;  // the peer's kernel buffers take what the staging held
  Link& link = transport_->link();
  const uint64_t tail = ring_->tx_position();
  uint64_t from = 0;
  int r = link.abandon_unconfirmed(&from, kStopMs);
  if (r != 0 || from > tail) {
    RDMASHIM_DEBUG("fd %d: unconfirmed ring writes not resent: %s", fd, r ? strerror(-r) : "past the tail");
    return false;
  }
  for (uint64_t pos = from; pos < tail;) {  // all staged, or nothing goes
    size_t n = 0;
    if (!link.staged(pos, &n) || n == 0) return false;
    pos += n;
  }
  struct {
    wire::FrameHeader h;
    wire::Downgrade d;
  } frame{{sizeof(wire::Downgrade), static_cast<uint16_t>(wire::FrameType::kDowngrade), 0},
          {from, wire::kDowngradeLeave, wire::kDowngradeResent, {}}};
  static_assert(sizeof frame == sizeof(wire::FrameHeader) + sizeof(wire::Downgrade));
  const uint64_t give_up = now_ns() + uint64_t{kSendMs} * 1'000'000;
  auto send_whole = [&](const void* p, size_t len) {
    const char* at = static_cast<const char*>(p);
    while (len > 0) {
      ssize_t n = sys::real().send(fd, at, len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        at += n, len -= static_cast<size_t>(n);
        continue;
      }
      uint64_t now = now_ns();
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || now >= give_up) return false;
      pollfd w{fd, POLLOUT, 0};
      sys::real().poll(&w, 1, static_cast<int>((give_up - now) / 1'000'000) + 1);
    }
    return true;
  };
  if (!send_whole(&frame, sizeof frame)) return false;
  for (uint64_t pos = from; pos < tail;) {
    size_t n = 0;
    const unsigned char* p = link.staged(pos, &n);
    if (!p || !send_whole(p, n)) return false;
    pos += n;
  }
  RDMASHIM_DEBUG("fd %d: %llu unconfirmed ring bytes resent on TCP from %llu", fd,
                 static_cast<unsigned long long>(tail - from), static_cast<unsigned long long>(from));
  note_reason(wire::kDowngradeResent);
  tx_ = Tx::kRaw;
  tx_ring_.store(false, std::memory_order_release);
  left_ring(kLeftTx);
  return true;
}

// A direction left its ring: said once in the log and the stats row; once
// both did, the connection is plain TCP for the hooks.
void Connection::left_ring(uint8_t dir) {
  uint8_t before = down_dirs_.fetch_or(dir, std::memory_order_acq_rel);
  if (before == 0) {
    uint8_t r = down_reason_.load(std::memory_order_relaxed);
    char why[16];
    snprintf(why, sizeof why, "%s%s", (r & 0x80) ? "peer-" : "", wire::downgrade_reason_name(r & 0x7f));
    stat_row_.downgraded(why);
    RDMASHIM_INFO("fd %d (%s) -> tcp:downgraded:%s", fd(), role_ == Role::kClient ? "client" : "server", why);
  }
  if ((before | dir) == (kLeftTx | kLeftRx)) passthrough_.store(true, std::memory_order_relaxed);
  // Sleepers re-evaluate at their next wake (the TCP bytes, or kSelfWakeMs):
  // this direction's readiness is the kernel's now.
}

}  // namespace rdmashim
