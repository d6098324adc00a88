// Fork and exec with a ring that cannot follow them (verbs: the queue pair,
// its queues and its registered memory belong to this process; a forked
// child must not touch them, and a new image does not have them).
//
// Before the real fork() (in the parent) or execve(), such a connection
// leaves its rings for TCP in both directions at once (downgrade.cc's
// frames): our tx leaves now, Downgrade{P, Leave|Ask|Now}, and we wait, up
// to the setup timeout, for the peer's Downgrade{Q, Leave}, which the peer
// sends at once because of Now (it does not wait for data of its own). The
// bytes [head, Q) the peer had put in our ring and we have not read are then
// final: they move into a shared-memory ring whose producer has left at Q
// (ShmTransport::hold), which follows fork and exec like any shared-memory
// ring. Parent and child (or the new image) read each of them once, in
// order, then the raw TCP bytes. With nothing unread the connection is plain
// TCP at once. A peer that does not answer in time (busy elsewhere, not in a
// call on this connection) leaves our rx on the ring: the stream is the
// parent's as before (the child sees it as reset), and a warning says so.
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "conn/connection.h"
#include "shm/shm_transport.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/log.h"
#include "util/iov.h"
#include "util/misc.h"
#include "ring/ring_limits.h"

namespace rdmashim {

namespace {

// What the held ring is filled with: the framed bytes read off the TCP side
// first, then the unread ring bytes, as a peek of the ring reads them.
struct HeldBytes {
  const std::vector<unsigned char>* early;
  RingChannel* ring;
  static bool fill(void* ctx, const iovec* iov, int n) {
    auto* h = static_cast<HeldBytes*>(ctx);
    size_t total = iov_total(iov, n), e = h->early->size();
    iovec part[4];
    size_t done = 0;
    for (int i = 0; i < n && done < e; ++i) {  // the early bytes, across the iovecs
      size_t k = iov[i].iov_len < e - done ? iov[i].iov_len : e - done;
      memcpy(iov[i].iov_base, h->early->data() + done, k);
      done += k;
    }
    if (total == e) return true;
    int m = iov_slice(iov, n, e, SIZE_MAX, part, 4);
    return h->ring && h->ring->read(part, m, true) == static_cast<ssize_t>(total - e);
  }
};

}  // namespace

int Connection::hand_over_ring(uint8_t reason) {
  if (orphaned_ || parents_transport_ || !transport_ || passthrough()) return 0;
  const char* what = reason == wire::kDowngradeExec ? "exec" : "fork";
  const char* who = reason == wire::kDowngradeExec ? "new program" : "child";
  const char* role = role_ == Role::kClient ? "client" : "server";
  // Never wait long behind another thread's call on this stream: a reader
  // blocked on it holds the receive lock for as long as the peer is quiet.
  std::unique_lock<std::mutex> rx(rx_mu_, std::defer_lock);
  std::unique_lock<std::mutex> tx(tx_mu_, std::defer_lock);
  for (int i = 0;; ++i) {
    if (rx.try_lock()) {
      if (tx.try_lock()) break;
      rx.unlock();
    }
    if (i == 100) {
      RDMASHIM_WARN("fd %d (%s): another thread is in a call on this %s stream at %s; the %s cannot use it", fd(),
                    role, transport_->name(), what, who);
      return -EBUSY;
    }
    usleep(1000);
  }
  if (!transport_ || transport_->survives_fork() || in_setup_.load(std::memory_order_relaxed)) return 0;
  const bool framed_ok = tx_ != Tx::kFramed || (tx_hdr_left_ == 0 && tx_frame_left_ == 0);
  if (!peer_downgrades_.load(std::memory_order_relaxed) || !framed_ok) {
    RDMASHIM_WARN("fd %d (%s): this %s stream cannot leave its ring at %s (%s); the %s sees it as reset", fd(), role,
                  transport_->name(), what,
                  framed_ok ? "the peer's rdmashim is older" : "a frame is half sent", who);
    return -ENOTSUP;
  }
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  tx_held_ = true;
  note_reason(reason);
  const uint64_t t0 = now_ns(), give_up = t0 + uint64_t{config().setup_timeout_ms} * 1'000'000;
  bool rx_open = (rx_ == Rx::kRing && !rx_leaving_.load(std::memory_order_relaxed)) || rx_ == Rx::kFramed;
  int r = 0;
  if (tx_ == Tx::kRing || tx_ == Tx::kFramed) {
    // After our own FIN nothing more can go on TCP: the peer cannot be asked.
    if (tx_shut_.load(std::memory_order_relaxed)) {
      tx_ = Tx::kRaw;  // its stream ended: writes fail on TCP as on the ring
      tx_ring_.store(false, std::memory_order_release);
      if (rx_open && !tcp_eof_ && !peer_closed_) r = -EPIPE;
    } else if (!leave_tx_now(rx_open ? wire::kDowngradeAsk | wire::kDowngradeNow : 0)) {
      r = -EPIPE;
    }
  }
  std::vector<unsigned char> early;
  if (r == 0 && rx_ == Rx::kFramed) r = read_framed_rest(&early, give_up);
  if (r == 0 && rx_ == Rx::kRing) r = await_peer_leave(give_up);
  uint64_t kept = 0;
  const char* was = transport_->name();
  if (r == 0) r = hold_unread(early, &kept);
  tx_held_ = false;
  if (r == 0) {
    RDMASHIM_INFO("fd %d (%s): %llu unread bytes of its %s stream kept for the %s (hand-over %.1f ms)", fd(), role,
                  static_cast<unsigned long long>(kept), was, who, static_cast<double>(now_ns() - t0) / 1e6);
  }
  if (r != 0) {
    RDMASHIM_WARN("fd %d (%s): the peer did not leave its %s ring within %u ms at %s (%s); the %s sees this stream as reset",
                  fd(), role, transport_->name(), config().setup_timeout_ms, what,
                  r == -ETIMEDOUT ? "no answer" : strerror(-r), who);
  }
  return r;
}

// Both locks held: our tx leaves, Downgrade{position, Leave | flags}, now,
// on its own (the peer is alive: it is asked to answer at once, and we wait
// for that answer before anything else happens here). A framed tx (at a
// frame boundary) leaves at position 0: the peer's rx goes raw at once.
bool Connection::leave_tx_now(uint8_t flags) {
  wire::Downgrade d{};
  d.reason = static_cast<uint8_t>(down_reason_.load(std::memory_order_relaxed) & 0x7f);
  if (tx_ == Tx::kRing) {
    flush_tx();  // our ring writes land before the peer reads where they end
    d.position = ring_->tx_position();
  }
  d.flags = static_cast<uint8_t>(wire::kDowngradeLeave | flags);
  if (send_control(wire::FrameType::kDowngrade, &d, sizeof d) != 0) return false;
  if (flags & wire::kDowngradeAsk) down_asked_ = true;
  down_want_.store(0, std::memory_order_relaxed);
  tx_ = Tx::kRaw;
  tx_want_ = TxWant::kNone;
  tx_again_.fetch_add(1, std::memory_order_relaxed);
  tx_ring_.store(false, std::memory_order_release);
  left_ring(kLeftTx);
  return true;
}

// Both locks held, rx framed: the peer's DATA frames still on the TCP side
// are read into `early`, up to its Switch (then its ring follows), its
// Downgrade or Plain (then raw bytes follow) or its FIN.
int Connection::read_framed_rest(std::vector<unsigned char>* early, uint64_t give_up_ns) {
  while (rx_ == Rx::kFramed) {
    int r;
    if (rx_frame_left_ > 0) {
      size_t at = early->size();
      early->resize(at + rx_frame_left_);
      iovec v{early->data() + at, rx_frame_left_};
      ssize_t n = tcp_recv(&v, 1, MSG_DONTWAIT);
      early->resize(at + (n > 0 ? static_cast<size_t>(n) : 0));
      if (n > 0) rx_frame_left_ -= static_cast<uint32_t>(n);
      r = n > 0 ? 1 : static_cast<int>(n);
    } else {
      r = read_frame(MSG_DONTWAIT);
    }
    if (r == 0) {  // FIN: the stream ends after what was read
      tcp_eof_ = true;
      return 0;
    }
    if (r > 0) continue;
    if (r != -EAGAIN && r != -EWOULDBLOCK && r != -EINTR) return r;
    uint64_t now = now_ns();
    if (now >= give_up_ns) return -ETIMEDOUT;
    pollfd p{fd(), POLLIN, 0};
    int ms = static_cast<int>((give_up_ns - now) / 1'000'000) + 1;
    sys::real().poll(&p, 1, ms < 50 ? ms : 50);
  }
  return 0;
}
// Both locks held, rx on the ring: reads the TCP side until the peer's
// Downgrade (or its FIN) says where its ring stream ends, then waits until
// the ring's tail is there (a verbs link learns it from its completions).
int Connection::await_peer_leave(uint64_t give_up_ns) {
  while (!rx_leaving_.load(std::memory_order_relaxed) && !peer_closed_ && !tcp_eof_ && tcp_error_ == 0) {
    if (poll_control()) continue;
    uint64_t now = now_ns();
    if (now >= give_up_ns) return -ETIMEDOUT;
    pollfd p{fd(), POLLIN, 0};
    int ms = static_cast<int>((give_up_ns - now) / 1'000'000) + 1;
    sys::real().poll(&p, 1, ms < 50 ? ms : 50);
  }
  if (tcp_error_ != 0 && !rx_leaving_.load(std::memory_order_relaxed)) return -tcp_error_;
  // The end of the peer's ring stream: its Leave position, its Close, or
  // (FIN: it shut down writing after flushing its writes) what has landed.
  uint64_t end = rx_leaving_.load(std::memory_order_relaxed) ? rx_down_pos_ : peer_closed_ ? peer_final_ : 0;
  Link& link = ring_->link();
  if (end == 0 && !rx_leaving_.load(std::memory_order_relaxed)) {
    uint64_t settle = now_ns() + 20'000'000;  // completions of writes already placed
    while (now_ns() < settle) {
      end = link.peer_tail();
      usleep(1000);
    }
    end = link.peer_tail();
  }
  while (link.peer_tail() < end) {
    if (link.error() != 0) return link.error();
    if (now_ns() >= give_up_ns) return -ETIMEDOUT;
    usleep(200);
  }
  if (link.peer_tail() != end) {
    broken("ring written past its end");
    return -EPROTO;
  }
  rx_down_pos_ = end;
  return 0;
}

// Both locks held, the peer's stream known to end: `early` (framed bytes
// read off the TCP side) and the ring's unread bytes [head, end) are final.
// None: rx is raw TCP now (after a FIN, at its end there). Else they move to
// a shared-memory ring that follows fork and exec (positions from 0), and
// the verbs transport is retired.
int Connection::hold_unread(const std::vector<unsigned char>& early, uint64_t* kept) {
  const bool on = rx_ == Rx::kRing;
  const bool left = on ? rx_leaving_.load(std::memory_order_relaxed) : rx_ == Rx::kRaw;
  const uint64_t head = on ? ring_->rx_position() : 0, end = on ? rx_down_pos_ : 0;
  if (head > end) return -EPROTO;
  const uint64_t n = early.size() + (end - head);
  *kept = n;
  if (n == 0) {
    if (on) {
      (void)finish_rx_downgrade();
    } else if (rx_ == Rx::kRaw) {
      left_ring(kLeftRx);
      update_passthrough();
    }
    return 0;
  }
  size_t size = transport_->link().ring_size();
  while (size < n && size < kMaxRingSize) size <<= 1;
  if (n > size) return -EMSGSIZE;
  HeldBytes bytes{&early, on ? ring_.get() : nullptr};
  int err = 0;
  auto held = shm::ShmTransport::hold(role_ == Role::kClient ? shm::kClient : shm::kServer, size, 0, n,
                                      left || rx_ == Rx::kRaw, &HeldBytes::fill, &bytes, &err);
  std::unique_ptr<RingChannel> held_ring;
  if (held) held_ring.reset(new (std::nothrow) RingChannel(held->link()));
  if (!held_ring) return err != 0 ? err : -ENOMEM;
  held_ring->resync_rx();
  if (retired_ == nullptr) {  // a framed stream's transport may still be the first
    retired_ = std::move(transport_);
    retired_ring_ = std::move(ring_);
    if (retired_) retired_->link().set_exit_notice({});  // the stream is no longer its
  }
  transport_ = std::move(held);
  ring_ = std::move(held_ring);
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_fd_ = transport_->link().wait_fd();
  }
  // Read as a ring whose producer left at n (or, after a FIN, ended there).
  rx_down_pos_ = n;
  rx_leaving_.store(left || rx_ == Rx::kRaw, std::memory_order_release);
  rx_frame_left_ = rx_hdr_have_ = rx_ctl_have_ = 0;
  rx_ = Rx::kRing;
  rx_ring_.store(true, std::memory_order_release);
  passthrough_.store(false, std::memory_order_relaxed);
  return 0;
}

// rx_mu_ held, the peer's Ask with Now: it waits for our Leave (it is about
// to fork or exec), so our tx leaves at once rather than with our next
// send. A writer of ours that holds the send lock (waiting for room) leaves
// by itself within kSelfWakeMs.
void Connection::answer_ask_now() {
  std::unique_lock<std::mutex> tx(tx_mu_, std::defer_lock);
  if (!tx_held_ && !tx.try_lock()) return;
  bool boundary = tx_ == Tx::kRing || (tx_ == Tx::kFramed && tx_hdr_left_ == 0 && tx_frame_left_ == 0);
  if (boundary && !tx_shut_.load(std::memory_order_relaxed) && (!transport_ || !transport_->ever_shared())) {
    (void)leave_tx_now(0);
  }
}

}  // namespace rdmashim
