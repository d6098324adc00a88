// The data path: recv and send in every mode (raw TCP, DATA frames, the
// ring), the control frames read and written on the TCP side, and the urgent
// byte (MSG_OOB) beside a ring.
#include "conn/connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "ring/ring_limits.h"
#include "sys/calls.h"
#include "sys/sys.h"
#include "util/iov.h"
#include "util/misc.h"
#include "util/user_copy.h"
#include "util/schedule.h"

namespace rdmashim {
namespace {

constexpr int kMaxIov = 64;

}  // namespace

// ---------------------------------------------------------------------------
// Receiving

ssize_t Connection::recv_stream(const iovec* iov, int iovcnt, int flags, sys::Calls calls) {
  io_started_.store(true, std::memory_order_relaxed);
  last_calls_.store(calls, std::memory_order_relaxed);
  sys::CallScope scope(calls, false);
  if (orphaned_) return -ECONNRESET;
  std::lock_guard<std::mutex> lock(rx_mu_);
  follow_sibling_switch_rx();
  if (rx_ == Rx::kRaw) return tcp_recv(iov, iovcnt, flags);
  if (sched::on() && rx_ == Rx::kRing && sched::downgrade_now()) (void)downgrade(wire::kDowngradeTest);
  if (flags & MSG_OOB) return rx_ == Rx::kRing ? recv_urgent(iov, iovcnt, flags) : -EINVAL;
  size_t want = iov_total(iov, iovcnt);
  if (want == 0) {
    // TCP waits (once) for data even for zero bytes: read(2)'s shortcut is in the hooks.
    if (rx_ == Rx::kRing && !rx_left_ring()) return recv_ring_empty(flags);
    return tcp_recv(iov, iovcnt, flags & ~MSG_WAITALL);
  }
  if (!(flags & MSG_WAITALL) || (flags & MSG_PEEK)) return recv_some(iov, iovcnt, flags & ~MSG_WAITALL);
  size_t got = 0;
  while (got < want) {
    iovec part[kMaxIov];
    int n = iov_slice(iov, iovcnt, got, SIZE_MAX, part, kMaxIov);
    ssize_t r = recv_some(part, n, flags & ~MSG_WAITALL);
    if (r <= 0) {
      if (got > 0) break;
      return r;
    }
    got += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(got);
}

ssize_t Connection::recv_some(const iovec* iov, int iovcnt, int flags) {
  for (;;) {
    int r = 0;
    switch (rx_) {
      case Rx::kRaw:
        return tcp_recv(iov, iovcnt, flags);
      case Rx::kDetectHello:
        if (const iovec* into = read_first_into(iov, iovcnt, flags)) {
          ssize_t got = 0;
          if (read_first(*into, flags, &got)) return got;
          continue;  // a Hello, and nothing for the program yet
        }
        r = detect_hello(flags, true);
        break;
      case Rx::kAwaitAck:
        r = await_ack(flags, true);
        break;
      case Rx::kFramed:
        if (rx_frame_left_ > 0) {
          iovec part[kMaxIov];
          int n = iov_slice(iov, iovcnt, 0, rx_frame_left_, part, kMaxIov);
          ssize_t got = tcp_recv(part, n, flags);
          if (got > 0 && !(flags & MSG_PEEK)) rx_frame_left_ -= static_cast<uint32_t>(got);
          return got;
        }
        follow_sibling_switch_rx();
        if (rx_ == Rx::kRing) continue;
        r = read_frame(flags);
        if (r == 0) return 0;  // EOF at a frame boundary
        if (r > 0) r = 0;
        if (r == -EAGAIN) RDMASHIM_SCHED_POINT(kReadEmpty);  // as on the ring (recv_ring)
        break;
      case Rx::kRing:
        return recv_ring(iov, iovcnt, flags);
    }
    if (r < 0) return r;
  }
}

// Reads one frame header and its control payload, waiting as `flags` say.
// 1: a frame is complete in rx_hdr_/rx_ctl_; 0: EOF; <0: -errno.
int Connection::read_frame_bytes(int flags) {
  while (rx_hdr_have_ < sizeof rx_hdr_) {
    iovec v{reinterpret_cast<char*>(&rx_hdr_) + rx_hdr_have_, sizeof rx_hdr_ - rx_hdr_have_};
    ssize_t n = tcp_recv(&v, 1, flags & MSG_DONTWAIT);
    if (n <= 0) return static_cast<int>(n);
    rx_hdr_have_ += static_cast<uint32_t>(n);
  }
  if (!wire::valid(rx_hdr_)) return -EPROTO;
  bool is_data = rx_hdr_.type == static_cast<uint16_t>(wire::FrameType::kData);
  while (!is_data && rx_ctl_have_ < rx_hdr_.length) {
    iovec v{rx_ctl_ + rx_ctl_have_, rx_hdr_.length - rx_ctl_have_};
    ssize_t n = tcp_recv(&v, 1, flags & MSG_DONTWAIT);
    if (n <= 0) return static_cast<int>(n);
    rx_ctl_have_ += static_cast<uint32_t>(n);
  }
  return 1;
}

// Framed mode: one frame. Returns 1 after acting on it, 0 on EOF, <0 -errno.
int Connection::read_frame(int flags) {
  int r = read_frame_bytes(flags);
  if (r == -EPROTO) return broken("malformed frame header");
  if (r <= 0) return r;
  return take_frame();
}

// The frame whose header and control payload are in rx_hdr_ and rx_ctl_:
// 1 after acting on it, <0 -errno.
int Connection::take_frame() {
  wire::FrameHeader h = rx_hdr_;
  rx_hdr_have_ = 0;
  rx_ctl_have_ = 0;
  switch (static_cast<wire::FrameType>(h.type)) {
    case wire::FrameType::kData:
      rx_frame_left_ = h.length;
      return 1;
    case wire::FrameType::kSwitch:
      if (!ring_) return broken("switch without a transport");
      RDMASHIM_SCHED_POINT(kSwitchReceived);
      transport_->mark_switched(Transport::Dir::kRx);
      rx_ = Rx::kRing;
      rx_ring_.store(true, std::memory_order_seq_cst);  // before the watchers are read: watch_switch
      kick_switch_watchers();
      return 1;
    case wire::FrameType::kPlain: {
      RDMASHIM_SCHED_POINT(kPlainReceived);
      auto tx = lock_tx_for_handler();
      on_peer_plain();
      return 1;
    }
    case wire::FrameType::kParams:  // only ever right after a Hello or an Ack
      return broken("stray params frame");
    case wire::FrameType::kDowngrade: {
      if (!peer_downgrades_.load(std::memory_order_relaxed)) return broken("downgrade frame not offered");
      wire::Downgrade d;
      memcpy(&d, rx_ctl_, sizeof d);
      on_peer_downgrade(d);
      return 1;
    }
    case wire::FrameType::kClose:  // only meaningful on a ring; before it, FIN says it all
    case wire::FrameType::kUrgent:  // only sent after the Switch
    case wire::FrameType::kPing:
      return 1;
  }
  return broken("unknown frame");
}

// Ring mode: drains control frames that arrived on the TCP side, without
// waiting. Returns true if anything changed (a frame, EOF, a reset).
bool Connection::poll_control() {
  bool changed = false;
  follow_sibling_downgrade();
  if (rx_leaving_.load(std::memory_order_relaxed)) return false;  // raw bytes follow the Downgrade
  for (;;) {
    int r = read_frame_bytes(MSG_DONTWAIT);
    if (r == -EAGAIN || r == -EWOULDBLOCK || r == -EINTR) return changed;
    if (r == 0) {
      // FIN: the peer will not write again. Whether it still reads is for
      // the writer to find out (see wait_ring). Once: the kernel says it at
      // every look.
      if (tcp_eof_) return changed;
      tcp_eof_ = true;
      tcp_done_.store(true, std::memory_order_relaxed);
      peer_wr_shut_.store(true, std::memory_order_relaxed);
      if (awaiting_end()) {
        end_pending_.store(true, std::memory_order_relaxed);
        probe_announced_end();
      } else {
        rx_end_.store(true, std::memory_order_release);
      }
      return true;
    }
    if (r < 0) {
      if (r == -EPROTO) {
        broken("malformed control frame");
      } else {
        tcp_error_ = -r;
        tcp_done_.store(true, std::memory_order_relaxed);
        peer_gone_.store(true, std::memory_order_relaxed);
        end_pending_.store(false, std::memory_order_relaxed);
        rx_end_.store(true, std::memory_order_release);
      }
      return true;
    }
    wire::FrameHeader h = rx_hdr_;
    rx_hdr_have_ = 0;
    rx_ctl_have_ = 0;
    if (h.type == static_cast<uint16_t>(wire::FrameType::kClose)) {
      // Only sent when its last writes were not confirmed (announce_end):
      // the end is there, not at the FIN that follows.
      memcpy(&peer_final_, rx_ctl_, sizeof peer_final_);
      peer_closed_ = true;
      peer_wr_shut_.store(true, std::memory_order_relaxed);
      if (!awaiting_end()) rx_end_.store(true, std::memory_order_release);
    } else if (h.type == static_cast<uint16_t>(wire::FrameType::kUrgent)) {
      wire::Urgent u;
      memcpy(&u, rx_ctl_, sizeof u);
      urg_pos_ = u.position;
      urg_byte_ = u.byte;
      urg_state_.store(kUrgValid, std::memory_order_release);
    } else if (h.type == static_cast<uint16_t>(wire::FrameType::kDowngrade)) {
      if (!peer_downgrades_.load(std::memory_order_relaxed)) {
        broken("downgrade frame not offered");
        return true;
      }
      wire::Downgrade d;
      memcpy(&d, rx_ctl_, sizeof d);
      on_peer_downgrade(d);
      if (rx_leaving_.load(std::memory_order_relaxed)) return true;  // no frame after it
    } else if (h.type != static_cast<uint16_t>(wire::FrameType::kPing)) {
      broken("data frame after switch");
      return true;
    }
    changed = true;
  }
}

// rx_mu_ held: read up to where the peer's Close frame said its stream ends.
void Connection::reached_announced_end() {
  end_pending_.store(false, std::memory_order_relaxed);
  rx_end_.store(true, std::memory_order_release);  // readiness: EOF is next
}

void Connection::probe_announced_end() {
  if (peer_gone_.load(std::memory_order_relaxed)) {
    tcp_error_ = ECONNRESET;
  } else {
    std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);  // frames stay whole on the TCP side
    if (tx.owns_lock()) ping_if_due();
    if (!peer_gone_.load(std::memory_order_relaxed)) return;  // its RST, if it comes, ends the stream
    tcp_error_ = ECONNRESET;
  }
  end_pending_.store(false, std::memory_order_relaxed);
  rx_end_.store(true, std::memory_order_release);
}

ssize_t Connection::recv_ring(const iovec* iov, int iovcnt, int flags) {
  int64_t dl = kDeadlineUnknown;
  SideLock side(*this, Transport::Dir::kRx);
  iovec part[kMaxIov];
  for (;;) {
    if (abort_if_data_after_shutdown()) {
      // What came before the shutdown can still be read, then the reset once.
      uint64_t pos = ring_->rx_position(), end = shut_tail_.load(std::memory_order_acquire);
      if (pos < end) {
        iovcnt = iov_slice(iov, iovcnt, 0, end - pos, part, kMaxIov);
        iov = part;
      } else {
        if (abort_reported_) return 0;
        abort_reported_ = true;
        int err = 0;  // the kernel holds the same error: report it once, not twice
        socklen_t len = sizeof err;
        sys::real().getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
        return -ECONNRESET;
      }
    }
    size_t lowat = rcvlowat();
    if (lowat > 1 && !(flags & MSG_TRUNC)) {
      // SO_RCVLOWAT: a blocking read waits for min(lowat, len) bytes.
      size_t want = iov_total(iov, iovcnt);
      size_t target = want < lowat ? want : lowat;
      ssize_t avail = ring_->readable();
      if (avail > 0 && static_cast<size_t>(avail) < target && !rx_end_.load(std::memory_order_acquire) &&
          !rx_leaving_.load(std::memory_order_relaxed) && !nonblocking(flags)) {
        if (dl == kDeadlineUnknown) dl = deadline(SO_RCVTIMEO);
        side.release();
        int w = wait_ring(false, dl, target);
        side.reacquire();
        if (w == -EINTR) return w;
        if (w == 0) continue;  // -EAGAIN: the timeout; read what is there
      }
    }
    if (urg_state_.load(std::memory_order_relaxed) != kUrgNone) {
      // A read stops at the urgent mark; past it the mark is forgotten.
      uint64_t pos = ring_->rx_position();
      if (pos < urg_pos_) {
        iovcnt = iov_slice(iov, iovcnt, 0, urg_pos_ - pos, part, kMaxIov);
        iov = part;
      } else if (!(flags & MSG_PEEK) && ring_->readable() > 0) {
        urg_state_.store(kUrgNone, std::memory_order_relaxed);
      }
    }
    ssize_t r = (flags & MSG_TRUNC) ? ring_->discard(iov_total(iov, iovcnt))
                                    : ring_->read(iov, iovcnt, (flags & MSG_PEEK) != 0);
    note_maintenance();
    if (r > 0 || r == -EFAULT) {
      if (RDMASHIM_UNLIKELY(peer_closed_) && !(flags & MSG_PEEK) && !awaiting_end()) reached_announced_end();
      return r;
    }
    if (r < 0) return broken("ring cursor out of bounds");
    follow_sibling_downgrade();
    if (rx_left_ring()) {  // the peer's ring stream ended here: the rest is on TCP
      side.release();
      return tcp_recv(iov, iovcnt, flags);
    }
    if (rx_shut_.load(std::memory_order_relaxed)) return 0;
    if (peer_closed_ && ring_->rx_position() >= peer_final_) {
      release_rx_for_good();  // drained, and the peer writes no more
      return 0;
    }
    if (tcp_error_ != 0) {
      // Like the kernel: the error once, then end of stream (what a Close
      // frame announced is not coming: the stream was cut).
      int e = std::exchange(tcp_error_, 0);
      tcp_eof_ = true;
      peer_closed_ = false;
      end_pending_.store(false, std::memory_order_relaxed);
      return -e;
    }
    if (tcp_eof_ && !end_pending_.load(std::memory_order_relaxed)) {
      release_rx_for_good();
      return 0;
    }
    if (nonblocking(flags)) {
      if (poll_control()) continue;
      if (end_pending_.load(std::memory_order_relaxed)) {
        probe_announced_end();
        if (tcp_error_ != 0) continue;
      }
      RDMASHIM_SCHED_POINT(kReadEmpty);  // still holding the receive lock: a look at readiness must not lose a FIN
      return -EAGAIN;
    }
    if (end_pending_.load(std::memory_order_relaxed)) {
      poll_control();  // the RST a ping drew
      probe_announced_end();
      if (tcp_error_ != 0) continue;
    }
    if (dl == kDeadlineUnknown) dl = deadline(SO_RCVTIMEO);
    side.release();
    int w = wait_ring(false, dl);
    side.reacquire();
    if (w < 0) return w;
  }
}

// recv() of zero bytes on a ring: like TCP, 0 at once if data (or the end)
// is there, EAGAIN if not and non-blocking, else 0 after one wait.
ssize_t Connection::recv_ring_empty(int flags) {
  SideLock side(*this, Transport::Dir::kRx);
  ssize_t avail = ring_->readable();
  if (avail < 0) return broken("ring cursor out of bounds");
  if (avail > 0 || rx_end_.load(std::memory_order_acquire)) return 0;
  if (nonblocking(flags)) {
    poll_control();  // a FIN or reset on the TCP side ends the wait too
    return rx_end_.load(std::memory_order_acquire) ? 0 : -EAGAIN;
  }
  int64_t dl = deadline(SO_RCVTIMEO);
  for (;;) {  // until something arrives: a stale doorbell is not a wakeup
    side.release();
    int w = wait_ring(false, dl);
    side.reacquire();
    if (w < 0) return w == -EINTR ? w : 0;
    if (ring_->readable() != 0 || rx_end_.load(std::memory_order_acquire) || rx_leaving_.load(std::memory_order_relaxed)) return 0;
  }
}

// recv(MSG_OOB) on a ring: the urgent byte once, else EINVAL (as TCP).
ssize_t Connection::recv_urgent(const iovec* iov, int iovcnt, int flags) {
  poll_control();
  if (urg_state_.load(std::memory_order_relaxed) != kUrgValid) return -EINVAL;
  iovec one[1];
  if (iov_slice(iov, iovcnt, 0, 1, one, 1) == 0) return 0;
  if (!copy_user(one[0].iov_base, &urg_byte_, 1, one[0].iov_base)) return -EFAULT;
  if (!(flags & MSG_PEEK)) urg_state_.store(kUrgRead, std::memory_order_relaxed);
  return 1;
}

int Connection::at_mark() {
  if (!rx_ring_.load(std::memory_order_acquire)) return -1;
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  std::unique_lock<std::mutex> lock(rx_mu_, std::try_to_lock);  // never wait behind a blocked reader
  if (lock.owns_lock()) poll_control();
  return urg_state_.load(std::memory_order_relaxed) != kUrgNone && ring_->rx_position() == urg_pos_ ? 1 : 0;
}

// send(MSG_OOB) on a ring: all but the last byte into the ring, the last
// one (the urgent byte) beside it in a control frame marking its place.
ssize_t Connection::send_ring_urgent(const iovec* iov, int iovcnt, int flags) {
  size_t total = iov_total(iov, iovcnt);
  if (total == 0) return send_ring(iov, iovcnt, flags);
  iovec part[kMaxIov];
  size_t head = total - 1;
  if (head > 0) {
    int n = iov_slice(iov, iovcnt, 0, head, part, kMaxIov);
    ssize_t r = send_ring(part, n, flags);
    if (r < 0 || static_cast<size_t>(r) < head) return r;
  }
  iovec last[1] = {};
  iov_slice(iov, iovcnt, head, 1, last, 1);
  wire::Urgent u{};
  u.position = ring_->tx_position();
  if (!copy_user(&u.byte, last[0].iov_base, 1, last[0].iov_base)) return head > 0 ? static_cast<ssize_t>(head) : -EFAULT;
  int r = send_control(wire::FrameType::kUrgent, &u, sizeof u);
  if (r != 0) return head > 0 ? static_cast<ssize_t>(head) : (r == -EPIPE ? epipe(flags) : r);
  return static_cast<ssize_t>(total);
}

size_t Connection::rcvlowat() {
  int v = rcvlowat_.load(std::memory_order_relaxed);
  if (v < 0) {
    v = 1;
    socklen_t len = sizeof v;
    if (sys::real().getsockopt(fd(), SOL_SOCKET, SO_RCVLOWAT, &v, &len) != 0 || v < 1) v = 1;
    rcvlowat_.store(v, std::memory_order_relaxed);
  }
  if (v <= 1) return 1;  // the default: readiness asks this on every poll
  // A ring smaller than twice the mark could never wake the reader; nor a
  // server whose own stream keeps to less than the ring (a client's larger
  // send buffer enlarged it: LocalState::tx_limit), which is at least the
  // host's size.
  size_t half = std::min(ring_->link().ring_size(), host_ring_size()) / 2;
  return static_cast<size_t>(v) < half ? static_cast<size_t>(v) : half;
}

// TCP resets a connection shut down in both directions when more data
// arrives (the peer gets an RST, our reads ECONNRESET). On a ring we notice
// the data at our next call; connect(AF_UNSPEC) makes the kernel send the RST.
bool Connection::abort_if_data_after_shutdown() {
  if (aborted_.load(std::memory_order_acquire)) return true;
  uint64_t at = shut_tail_.load(std::memory_order_acquire);
  if (at == UINT64_MAX || ring_->link().peer_tail() <= at) return false;
  if (aborted_.exchange(true)) return true;
  sockaddr unspec{};
  unspec.sa_family = AF_UNSPEC;
  sys::real().connect(fd(), &unspec, sizeof unspec);
  peer_gone_.store(true, std::memory_order_relaxed);
  tcp_done_.store(true, std::memory_order_relaxed);
  rx_end_.store(true, std::memory_order_release);
  return true;
}

// ---------------------------------------------------------------------------
// Sending

ssize_t Connection::send_stream(const iovec* iov, int iovcnt, int flags, sys::Calls calls) {
  // During the handshake a send may settle what the receive side is waiting
  // for (a Hello or an Ack already queued); it takes the receive lock only if
  // free, since a reader that holds it settles the same thing itself.
  io_started_.store(true, std::memory_order_relaxed);
  last_calls_.store(calls, std::memory_order_relaxed);
  sys::CallScope scope(calls, !(flags & MSG_NOSIGNAL));
  if (orphaned_) return -ECONNRESET;
  std::unique_lock<std::mutex> rx(rx_mu_, std::defer_lock);
  if (in_setup_.load(std::memory_order_relaxed)) (void)rx.try_lock();
  std::lock_guard<std::mutex> tx(tx_mu_);
  follow_sibling_switch_tx();
  if (rx.owns_lock()) {
    tx_held_ = true;
    int held = 0;
    if (rx_ == Rx::kDetectHello && tx_ == Tx::kUndecided) {
      held = await_hello_before_speaking(flags);
    } else if (rx_ == Rx::kAwaitAck) {
      (void)await_ack(MSG_DONTWAIT, false);
    }
    tx_held_ = false;
    rx.unlock();
    if (held != 0) return held;
  }
  if (tx_ == Tx::kUndecided) {
    // Our application speaks first and no Hello is here: its bytes go out as
    // they are. A Hello arriving later is stripped; the client goes plain.
    tx_ = Tx::kRaw;
    settle(stats::Outcome::kTcpServerSpokeFirst);
  }
  if (tx_shut_.load(std::memory_order_relaxed) && tx_ == Tx::kRing) return epipe(flags);
  if (tx_ == Tx::kFramed) {
    advance_tx(iov_total(iov, iovcnt) > 0);
    if (tx_ == Tx::kRaw && (rx.owns_lock() || rx.try_lock())) update_passthrough();
  }
  if (RDMASHIM_UNLIKELY(down_want_.load(std::memory_order_relaxed) != 0)) {
    if (iov_total(iov, iovcnt) > 0) apply_tx_downgrade();  // ahead of bytes only
  } else if (sched::on() && tx_ == Tx::kRing && peer_downgrades_.load(std::memory_order_relaxed) &&
             iov_total(iov, iovcnt) > 0 && sched::downgrade_now()) {
    note_reason(wire::kDowngradeTest);
    down_want_.fetch_or(kDownTx | kDownAsk, std::memory_order_relaxed);
    apply_tx_downgrade();
  }
  if (sys::sigpipe_raised()) return -EPIPE;  // our Switch found the stream broken: so would the program's write
  switch (tx_) {
    case Tx::kRing:
      return (flags & MSG_OOB) ? send_ring_urgent(iov, iovcnt, flags) : send_ring(iov, iovcnt, flags);
    case Tx::kFramed:
      return send_framed(iov, iovcnt, flags);
    default:
      return tcp_send(iov, iovcnt, flags);
  }
}

int Connection::send_control(wire::FrameType type, const void* payload, uint32_t len, int more) {
  unsigned char buf[sizeof(wire::FrameHeader) + wire::kMaxControlPayload];
  wire::FrameHeader h{len, static_cast<uint16_t>(type), 0};
  memcpy(buf, &h, sizeof h);
  if (len) memcpy(buf + sizeof h, payload, len);
  // Not a single byte yet: the caller may retry later. Once the first byte
  // left, the frame must be completed.
  return send_control_bytes(buf, sizeof h + len, more);
}

ssize_t Connection::send_framed(const iovec* iov, int iovcnt, int flags) {
  size_t total = iov_total(iov, iovcnt);
  if (total == 0) return tcp_send(iov, iovcnt, flags);
  int sflags = flags & (MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE);
  size_t done = 0;
  while (done < total) {
    if (tx_hdr_left_ == 0 && tx_frame_left_ == 0) {
      advance_tx(done == 0);  // with bytes already sent this call returns first
      if (tx_ != Tx::kFramed) {
        if (done > 0) return static_cast<ssize_t>(done);
        return tx_ == Tx::kRing ? send_ring(iov, iovcnt, flags) : tcp_send(iov, iovcnt, flags);
      }
      size_t len = total - done < wire::kMaxDataFrame ? total - done : wire::kMaxDataFrame;
      wire::FrameHeader h{static_cast<uint32_t>(len), static_cast<uint16_t>(wire::FrameType::kData), 0};
      memcpy(tx_hdr_, &h, sizeof h);
      tx_hdr_left_ = sizeof h;
      tx_frame_left_ = static_cast<uint32_t>(len);
    }
    iovec parts[kMaxIov + 1];
    int n = 0;
    if (tx_hdr_left_) parts[n++] = {tx_hdr_ + sizeof tx_hdr_ - tx_hdr_left_, tx_hdr_left_};
    n += iov_slice(iov, iovcnt, done, tx_frame_left_, parts + n, kMaxIov);
    size_t asked = iov_total(parts, n);
    ssize_t r = tcp_send(parts, n, sflags);
    if (r < 0) return done > 0 ? static_cast<ssize_t>(done) : r;
    size_t sent = static_cast<size_t>(r);
    size_t hdr = sent < tx_hdr_left_ ? sent : tx_hdr_left_;
    tx_hdr_left_ -= static_cast<uint32_t>(hdr);
    tx_frame_left_ -= static_cast<uint32_t>(sent - hdr);
    done += sent - hdr;
    // A short send (timeout, signal, non-blocking) ends the call like TCP's
    // would, unless only our header made progress.
    if (sent < asked && done > 0) break;
  }
  // No switch here even at a frame boundary: it waits for our next send (see tx_go_ring).
  return static_cast<ssize_t>(done);
}

ssize_t Connection::send_ring(const iovec* iov, int iovcnt, int flags) {
  size_t total = iov_total(iov, iovcnt);
  size_t done = 0;
  int64_t dl = kDeadlineUnknown;
  bool may_grow = false;
  SideLock side(*this, Transport::Dir::kTx);
  for (;;) {
    if (tx_shut_.load(std::memory_order_relaxed)) return done > 0 ? static_cast<ssize_t>(done) : epipe(flags);
    // After a reset TCP refuses to write, even if the ring has room.
    if (peer_gone_.load(std::memory_order_relaxed) && tcp_done_.load(std::memory_order_relaxed)) {
      return done > 0 ? static_cast<ssize_t>(done) : epipe(flags);
    }
    uint64_t now = 0;
    if (done == 0 && peer_wr_shut_.load(std::memory_order_relaxed) &&
        (now = now_ns()) - last_ping_ns_ >= uint64_t{kPingIntervalMs} * 1'000'000) {
      // The peer sent its FIN; if its socket is closed, TCP data would draw
      // an RST (POLLERR, SO_ERROR EPIPE) and a later write fails. A Ping does
      // the same on the TCP side; a peer that only half-closed eats it. At
      // most one per interval: a streaming reader rarely looks at its TCP side.
      last_ping_ns_ = now;
      int p = send_control(wire::FrameType::kPing, nullptr, 0);
      if (p == -EPIPE || p == -ECONNRESET) {
        peer_gone_.store(true, std::memory_order_relaxed);
        tcp_done_.store(true, std::memory_order_relaxed);
        return p == -EPIPE ? epipe(flags) : p;
      }
    }
    ssize_t r = ring_->write(iov, iovcnt, done, may_grow);
    if (r == -EFAULT) return done > 0 ? static_cast<ssize_t>(done) : r;
    if (r < 0) return broken("ring cursor out of bounds");
    done += static_cast<size_t>(r);
    note_tx_dirty();
    if (done == total) return static_cast<ssize_t>(done);
    if (RDMASHIM_UNLIKELY(down_want_.load(std::memory_order_relaxed) != 0)) {
      apply_tx_downgrade();  // asked to leave while we wait for room: the rest goes on TCP
      if (tx_ != Tx::kRing) {
        side.release();
        return send_after_downgrade(iov, iovcnt, done, flags);
      }
    }
    if (r > 0) may_grow = false;
    if (!may_grow && ring_->writable() > 0) {
      // Only the lap is full (elastic rings). A reader that drains frees
      // room within moments: a blocking writer waits that long, so the lap
      // stays small and cache-hot, and grows only if none came. A
      // non-blocking one grows at once, as poll already said POLLOUT (TCP
      // would take the bytes).
      if (!nonblocking(flags) && ring_->lap_room() == 0) {
        side.release();
        int w = wait_ring(true, static_cast<int64_t>(now_ns() + kGrowGraceNs));
        side.reacquire();
        if (w == -EINTR) return done > 0 ? static_cast<ssize_t>(done) : w;
      } else {
        // Growing for a peer whose socket is gone would only delay the
        // EPIPE a full lap brings (see wait_ring). A gone peer sent its FIN:
        // only then ask its kernel (a ping draws RST from a closed socket;
        // pinging a live peer could reset it as it closes: tests/interleave).
        pollfd p{fd(), POLLRDHUP, 0};
        if (sys::wait(&p, 1, 0) > 0) {
          if (p.revents & POLLERR) peer_gone_.store(true, std::memory_order_relaxed);
          else if (p.revents & POLLRDHUP) ping_if_due();
        }
      }
      if (peer_gone_.load(std::memory_order_relaxed)) return done > 0 ? static_cast<ssize_t>(done) : epipe(flags);
      may_grow = true;
      continue;
    }
    // The ring is full. If the peer's socket is gone it will never drain.
    if (peer_gone_.load(std::memory_order_relaxed)) return done > 0 ? static_cast<ssize_t>(done) : epipe(flags);
    tx_full_.fetch_add(1, std::memory_order_seq_cst);
    // Credit that arrived before the count moved may not be reported to an
    // edge-triggered waiter: use it now instead.
    if (ring_->writable() > 0) continue;
    if (nonblocking(flags)) return done > 0 ? static_cast<ssize_t>(done) : -EAGAIN;
    if (dl == kDeadlineUnknown) dl = deadline(SO_SNDTIMEO);
    side.release();
    int w = wait_ring(true, dl);
    side.reacquire();
    if (w < 0) return done > 0 ? static_cast<ssize_t>(done) : w;
  }
}

}  // namespace rdmashim
