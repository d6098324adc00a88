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
#include <new>

#include "conn/connection.h"
#include "shm/shm_transport.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/log.h"
#include "util/misc.h"

namespace rdmashim {

int Connection::hand_over_ring(uint8_t reason) {
  if (!on_ring() || orphaned_) return 0;
  const char* what = reason == wire::kDowngradeExec ? "exec" : "fork";
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
      RDMASHIM_WARN("fd %d (%s): another thread is in a call on this %s stream at %s; the %s cannot use it",
                    fd(), role, transport_ ? transport_->name() : "ring", what,
                    reason == wire::kDowngradeExec ? "new program" : "child");
      return -EBUSY;
    }
    usleep(1000);
  }
  if (!transport_ || transport_->survives_fork()) return 0;
  bool rx_on = rx_ == Rx::kRing && !rx_leaving_.load(std::memory_order_relaxed);
  if ((rx_ != Rx::kRing && rx_ != Rx::kRaw) || (tx_ != Tx::kRing && tx_ != Tx::kRaw) ||
      !peer_downgrades_.load(std::memory_order_relaxed)) {
    RDMASHIM_WARN("fd %d (%s): this %s stream cannot leave its ring at %s (%s); the %s sees it as reset", fd(), role,
                  transport_->name(), what,
                  peer_downgrades_.load(std::memory_order_relaxed) ? "its handshake is not settled"
                                                                   : "the peer's rdmashim is older",
                  reason == wire::kDowngradeExec ? "new program" : "child");
    return -ENOTSUP;
  }
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  tx_held_ = true;
  note_reason(reason);
  uint64_t give_up = now_ns() + uint64_t{config().setup_timeout_ms} * 1'000'000;
  int r = 0;
  if (tx_ == Tx::kRing) {
    // After our own FIN nothing more can go on TCP: the peer cannot be asked.
    if (tx_shut_.load(std::memory_order_relaxed)) {
      tx_ = Tx::kRaw;  // its stream ended: writes fail on TCP as on the ring
      tx_ring_.store(false, std::memory_order_release);
      if (rx_on && !tcp_eof_ && !peer_closed_) r = -EPIPE;
    } else if (!leave_tx_now(rx_on ? wire::kDowngradeAsk | wire::kDowngradeNow : 0)) {
      r = -EPIPE;
    }
  }
  if (r == 0 && rx_ == Rx::kRing) r = await_peer_leave(give_up);
  if (r == 0 && rx_ == Rx::kRing) r = hold_unread(reason);
  tx_held_ = false;
  if (r != 0) {
    RDMASHIM_WARN("fd %d (%s): the peer did not leave its %s ring within %u ms at %s (%s); the %s sees this stream as reset",
                  fd(), role, transport_->name(), config().setup_timeout_ms, what, r == -ETIMEDOUT ? "no answer" : "error",
                  reason == wire::kDowngradeExec ? "new program" : "child");
  }
  return r;
}

// Both locks held, tx on the ring: Downgrade{position, Leave | flags} goes
// out now, on its own (the peer is alive: it is asked to answer at once, and
// we wait for that answer before anything else happens here).
bool Connection::leave_tx_now(uint8_t flags) {
  flush_tx();  // our ring writes land before the peer reads where they end
  wire::Downgrade d{};
  d.reason = static_cast<uint8_t>(down_reason_.load(std::memory_order_relaxed) & 0x7f);
  d.position = ring_->tx_position();
  d.flags = static_cast<uint8_t>(wire::kDowngradeLeave | flags);
  if (send_control(wire::FrameType::kDowngrade, &d, sizeof d) != 0) return false;
  if (flags & wire::kDowngradeAsk) down_asked_ = true;
  down_want_.store(0, std::memory_order_relaxed);
  tx_ = Tx::kRaw;
  tx_again_.fetch_add(1, std::memory_order_relaxed);
  tx_ring_.store(false, std::memory_order_release);
  left_ring(kLeftTx);
  return true;
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

// Both locks held: the ring's unread bytes [head, end) are final. None: rx
// is raw TCP now (after a FIN, at its end there). Else they move to a
// shared-memory ring that follows fork and exec, and the verbs transport is
// retired.
int Connection::hold_unread(uint8_t reason) {
  const bool left = rx_leaving_.load(std::memory_order_relaxed);
  const uint64_t head = ring_->rx_position(), end = rx_down_pos_;
  if (head == end) {
    (void)finish_rx_downgrade();
    return 0;
  }
  if (head > end) return -EPROTO;
  // Copied out as a peek of the ring itself reads them (whatever the link's layout).
  auto fill = [](void* ring, const iovec* iov, int n) {
    size_t want = iov[0].iov_len + iov[1].iov_len;
    return static_cast<RingChannel*>(ring)->read(iov, n, true) == static_cast<ssize_t>(want);
  };
  int err = 0;
  auto held = shm::ShmTransport::hold(role_ == Role::kClient ? shm::kClient : shm::kServer,
                                      ring_->link().ring_size(), head, end, left, fill, ring_.get(), &err);
  std::unique_ptr<RingChannel> held_ring;
  if (held) held_ring.reset(new (std::nothrow) RingChannel(held->link()));
  if (!held_ring) return err != 0 ? err : -ENOMEM;
  held_ring->resync_rx();
  const char* was = transport_->name();
  retired_ = std::move(transport_);
  retired_ring_ = std::move(ring_);
  transport_ = std::move(held);
  ring_ = std::move(held_ring);
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_fd_ = transport_->link().wait_fd();
  }
  RDMASHIM_INFO("fd %d (%s): %llu unread bytes of its %s ring kept for the %s", fd(),
                role_ == Role::kClient ? "client" : "server", static_cast<unsigned long long>(end - head), was,
                reason == wire::kDowngradeExec ? "new program" : "child");
  return 0;
}

// rx_mu_ held, the peer's Ask with Now: it waits for our Leave (it is about
// to fork or exec), so our tx leaves at once rather than with our next
// send. A writer of ours that holds the send lock (waiting for room) leaves
// by itself within kSelfWakeMs.
void Connection::answer_ask_now() {
  std::unique_lock<std::mutex> tx(tx_mu_, std::defer_lock);
  if (!tx_held_ && !tx.try_lock()) return;
  if (tx_ == Tx::kRing && !tx_shut_.load(std::memory_order_relaxed) && !transport_->ever_shared()) {
    (void)leave_tx_now(0);
  }
}

}  // namespace rdmashim
