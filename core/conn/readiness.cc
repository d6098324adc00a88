// Readiness and waiting: what poll/select/epoll should report for a
// connection, the doorbell a waiter sleeps on, and the spin-then-sleep wait
// of a reader or writer on the ring.
#include "conn/connection.h"

#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "conn/thread_epoll.h"
#include "sys/calls.h"
#include "sys/sys.h"
#include "util/misc.h"
#include "util/process.h"
#include "util/signals.h"
#include "util/spin.h"
#include "util/schedule.h"

namespace rdmashim {

// ---------------------------------------------------------------------------
// Waiting

// Spins for RDMASHIM_SPIN_US, then sleeps on the doorbell and the TCP socket
// (which reports the peer's control frames, FIN and RST). Returns 0 when
// something may have changed, -EAGAIN at the deadline, -EINTR on a signal
// the kernel would not have restarted.
int Connection::wait_ring(bool for_write, int64_t dl, size_t min_bytes) {
  auto ready = [&] {
    if (for_write) return ring_->lap_room() != 0;
    ssize_t n = ring_->readable();
    return n < 0 || static_cast<size_t>(n) >= min_bytes || (min_bytes > 1 && rx_end_.load(std::memory_order_acquire));
  };
  Link& link = transport_->link();
  // A provider working on our cores (software RDMA: the kernel moves its
  // packets) gets the core every 16 turns, and the time a yield gives it is
  // the link's own work, not a preemption: counting it as one would make
  // every wait sleep (a fifth of the rate). Otherwise a yield now and then
  // lets a runnable peer on our core go first.
  // A peer on our own CPU (the scheduler keeps a waking pair together for
  // a while, tens of ms on these VMs) runs only when we yield: then every
  // turn yields (Spinner::yield_to_peer). Looked at again every few turns:
  // either of us may move. Only here, for one connection: the poll/epoll
  // spin over many gave its core to CPU hogs instead (redis-benchmark, 50
  // clients, two hogs: half the rate).
  const bool yields_to_provider = link.provider_on_our_cores();
  const uint32_t yield_mask = yields_to_provider ? 15 : 1023;
  Spinner spin(dl == kNoDeadline ? 0 : static_cast<uint64_t>(dl), yields_to_provider);
  bool beside_peer = spin.spinning() && link.waits_beside_peer(sched_getcpu());
  for (uint32_t i = 1; spin.spinning(); ++i) {
    if (ready()) {
      spin.found();
      return 0;
    }
    if (beside_peer) {
      spin.yield_to_peer();
    } else if ((i & yield_mask) == 0) {
      sched_yield();  // let a runnable peer (or provider) on our core go first
      if (yields_to_provider) spin.yielded();
    }
    if ((i & (beside_peer ? 3 : 63)) == 0) {
      if (!spin.keep_going()) break;
      beside_peer = link.waits_beside_peer(sched_getcpu());
    }
    cpu_relax();
  }
  const unsigned what = for_write ? Link::kWaitSpace : Link::kWaitData;
  link.prepare_sleep(what);
  RDMASHIM_SCHED_POINT(kWaitArmed);
  if (ready() || (for_write ? tx_shut_ : rx_shut_).load(std::memory_order_relaxed)) {
    link.finish_sleep(what, false);
    spin.found();
    return 0;
  }
  // A reader also waits for the TCP side to speak (control frames, FIN, RST).
  // A writer listens there for the peer's FIN and errors: a full ring to a
  // peer whose socket is gone would never drain, so once the peer sent its
  // FIN (a closed socket always has) it pings now and then, and a gone
  // peer's kernel answers with RST, which poll reports as POLLERR. Never
  // before the FIN: a ping landing just after a live peer read all and
  // closed would make its kernel reset the connection (tests/interleave).
  bool fin = for_write && peer_wr_shut_.load(std::memory_order_relaxed);
  if (fin) ping_if_due();
  // About to sleep: rings of this process that went idle give pages back.
  uint64_t own_due = 0;
  if (ring_->maintenance_wanted() && sandbox() == Sandbox::kNone) {
    // Registered memory (verbs) to grow, shrink or adopt, before we sleep:
    // here what needs the side we hold; listed, the registry below (or the
    // next sleep of this process) does what needs the other side.
    note_maintenance();
    own_due = link.maintain(now_ns(), for_write || tx_held_, !for_write);
  }
  uint64_t release_due = release_idle_memory(for_write || tx_held_ ? this : nullptr);
  if (own_due != 0 && (release_due == 0 || own_due < release_due)) release_due = own_due;
  short tcp_events = for_write ? (fin ? 0 : POLLRDHUP) : !tcp_done_.load(std::memory_order_relaxed) ? POLLIN : 0;
  pollfd p[2] = {{link.wait_fd(), POLLIN, 0}, {fd(), tcp_events, 0}};
  // A reader awaiting writes its peer announced before its FIN sleeps on the
  // doorbell alone (the ended TCP side would report a hang-up at once) and
  // looks for a gone peer (recv_ring's probe) every kPingIntervalMs.
  const bool end_pending = !for_write && end_pending_.load(std::memory_order_relaxed);
  const int nfds = end_pending ? 1 : 2;
  int timeout = -1;
  if (dl != kNoDeadline) {
    int64_t left = dl - static_cast<int64_t>(now_ns());
    timeout = left <= 0 ? 0 : static_cast<int>((left + 999'999) / 1'000'000);
  }
  if ((fin || end_pending) && (timeout < 0 || timeout > kPingIntervalMs)) timeout = kPingIntervalMs;
  // Only the peer can ring our doorbell (rendezvous.h): a writer looks at
  // tx_shut_ (shutdown(SHUT_WR) by another thread) at least this often. A
  // reader is woken by the TCP side, which shutdown(SHUT_RD) makes readable.
  if (for_write && (timeout < 0 || timeout > kSelfWakeMs)) timeout = kSelfWakeMs;
  if (release_due != 0) {  // wake when the rate limit lets that release happen
    uint64_t now = now_ns();
    int ms = release_due <= now ? 1 : static_cast<int>((release_due - now + 999'999) / 1'000'000);
    if (timeout < 0 || ms < timeout) timeout = ms;
  }
  const uint64_t asleep_ns = spin.learns() ? now_ns() : 0;
  // A thread that sleeps on this connection again and again keeps both
  // registered in an epoll of its own: one call, nothing to drain.
  thread_epoll::Sleep edge(end_pending ? 0 : link.edge_key(), p[0].fd, p[1].fd, tcp_events);
  int r, e;
  if (edge.active()) {
    r = edge.wait(p, timeout);
    e = errno;
  } else {
    r = sys::wait(p, nfds, timeout);  // the program's own way of sleeping
    e = errno;
    if (r < 0 && e == EINVAL) {
      // Fewer than two descriptors allowed (RLIMIT_NOFILE: OpenSSH's sandbox
      // sets 1): the doorbell alone, a slice at a time, and the TCP side is
      // looked at (without waiting) in between.
      r = sys::wait(p, 1, timeout < 0 || timeout > kPingIntervalMs ? kPingIntervalMs : timeout);
      e = errno;
      p[1].revents = tcp_events;
    }
  }
  if (edge.active()) {
    link.finish_edge_sleep(what);
  } else {
    link.finish_sleep(what, r > 0 && p[0].revents != 0);
  }
  if (ready()) {
    spin.found();
    if (asleep_ns != 0 && r > 0 && p[0].revents != 0) spin.slept(now_ns() - asleep_ns);  // rung by the answer
  }
  if (r < 0) {
    if (e != EINTR) return -e;
    return dl == kNoDeadline && signals_restart() ? 0 : -EINTR;
  }
  if (r == 0 && dl != kNoDeadline && static_cast<int64_t>(now_ns()) >= dl) return -EAGAIN;
  if (for_write) {
    if (p[1].revents & POLLERR) peer_gone_.store(true, std::memory_order_relaxed);
    if (p[1].revents & POLLRDHUP) peer_wr_shut_.store(true, std::memory_order_relaxed);  // pings from now on
    // A peer about to fork or exec asks us to leave and waits (handover.cc):
    // with no reader of ours on the TCP side, this writer reads its frames,
    // at its kSelfWakeMs pace (never waiting for the receive lock).
    if (rx_ring_.load(std::memory_order_acquire) && !tcp_done_.load(std::memory_order_relaxed) &&
        peer_downgrades_.load(std::memory_order_relaxed)) {
      std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
      if (rx.owns_lock()) poll_control();
    }
  } else if (p[1].revents) {
    poll_control();
  }
  return 0;
}

void Connection::ping_if_due() {
  uint64_t now = now_ns();
  if (now - last_ping_ns_ < uint64_t{kPingIntervalMs} * 1'000'000) return;
  last_ping_ns_ = now;
  int r = send_control(wire::FrameType::kPing, nullptr, 0);
  if (r == -EPIPE || r == -ECONNRESET) peer_gone_.store(true, std::memory_order_relaxed);
}

short Connection::poll_events(short want, short kernel) {
  if (orphaned_) return static_cast<short>((POLLERR | POLLHUP | (want & (POLLIN | POLLOUT))));
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  if (!passthrough() && (!rx_ring_.load(std::memory_order_relaxed) || !tx_ring_.load(std::memory_order_relaxed))) {
    follow_sibling_switches();
  }
  if (!rx_ring_.load(std::memory_order_acquire) && !passthrough()) {
    // A pending prefix keeps the kernel quiet (SO_RCVLOWAT) until its deadline:
    // then its bytes are the application's, so look as if they just came.
    uint64_t due = prefix_deadline_ns_.load(std::memory_order_relaxed);
    if (due != 0 && !(kernel & POLLIN) && now_ns() >= due) kernel |= POLLIN;
    if (kernel & POLLIN) kernel = consume_setup_bytes(kernel);
  }
  short ev = kernel & (POLLERR | POLLHUP | POLLNVAL);
  bool rx_ring = rx_ring_.load(std::memory_order_acquire);
  if (rx_ring && !rx_end_.load(std::memory_order_acquire) &&
      ((kernel & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) || rx_leaving_.load(std::memory_order_relaxed))) {
    // After the switch the TCP side carries only our control frames: it is
    // readable for the application only if it ended (FIN, RST, Close), or
    // after a Downgrade once the ring is read up to its end.
    std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
    control_unsettled_.store(!rx.owns_lock(), std::memory_order_relaxed);
    if (rx.owns_lock()) {
      poll_control();
      if (rx_leaving_.load(std::memory_order_relaxed) && finish_rx_downgrade()) {
        rx_ring = false;
        pollfd p{fd(), static_cast<short>(kernel_interest(want)), 0};  // the frame made it readable: ask again
        sys::wait(&p, 1, 0);
        kernel = static_cast<short>((kernel & ~(POLLIN | POLLRDNORM | POLLRDBAND | POLLPRI | POLLRDHUP)) | p.revents);
      }
    }
  }
  if (!rx_ring) {
    ev |= kernel & (POLLIN | POLLRDNORM | POLLRDBAND | POLLPRI | POLLRDHUP);
  } else {
    if (shut_tail_.load(std::memory_order_relaxed) != UINT64_MAX) abort_if_data_after_shutdown();
    size_t lowat = rcvlowat();
    bool data = lowat <= 1 ? ring_->readable_hint() : ring_->unread_hint() >= lowat;
    const bool end = rx_end_.load(std::memory_order_acquire);  // one look, for both bits
    if (data || end) ev |= POLLIN | POLLRDNORM;
    // The hang-up only with the end it announces, as the kernel reports
    // them: a FIN a writer of ours saw, or another thread is taking in right
    // now, or one whose announced writes are still on their way, is not
    // readable yet (an edge-triggered set reported EPOLLRDHUP alone, and
    // its reader never saw the EOF: asio.epoll_read_race_fin).
    if (end && (peer_wr_shut_.load(std::memory_order_relaxed) || rx_shut_.load(std::memory_order_relaxed))) {
      ev |= POLLRDHUP;
    }
    if (urg_state_.load(std::memory_order_relaxed) == kUrgValid) ev |= POLLPRI;
  }
  if (!tx_ring_.load(std::memory_order_acquire)) {
    // Not writable while a first write is held (after the look above: its
    // Hello may just have been read).
    bool held = hold_until_ns_.load(std::memory_order_relaxed) > kHoldOver && hold_goes_on();
    if (!held) ev |= kernel & (POLLOUT | POLLWRNORM | POLLWRBAND);
    if ((ev & want & (POLLOUT | POLLWRNORM)) && !writable_told_.load(std::memory_order_relaxed)) {
      writable_told_.store(true, std::memory_order_relaxed);  // a write must not meet a hold now
    }
  } else if (ring_->writable_hint() || peer_gone_.load(std::memory_order_relaxed) ||
             tx_shut_.load(std::memory_order_relaxed)) {
    ev |= POLLOUT | POLLWRNORM;  // after SHUT_WR the kernel too says writable (the write fails)
  }
  return static_cast<short>(ev & (want | POLLERR | POLLHUP | POLLNVAL));
}

short Connection::first_look(short want) {
  look_saw_bytes_.store(false, std::memory_order_relaxed);
  short ev = poll_events(want, POLLIN);  // as if the kernel said readable: the peek decides
  if (control_unsettled()) return -1;
  // Readable, but not for bytes of the program's that the look saw: the end
  // or an error (the kernel adds POLLHUP, POLLRDHUP, POLLERR), or a Hello.
  if ((ev & POLLIN) && !look_saw_bytes_.load(std::memory_order_relaxed)) return -1;
  return ev;
}

// False while the TCP side is readable and what is there may still need a
// look: the lock is still held, or (before the ring, where readiness is the
// kernel's word) a look must ask the kernel again; true once nothing is left.
bool Connection::settle_control() {
  if (!control_unsettled()) return true;
  // Cleared first: read meanwhile, or the end already seen (a FIN stays
  // readable), it needs nothing more, and a new frame is a new kernel edge.
  control_unsettled_.store(false, std::memory_order_relaxed);
  pollfd p{fd(), POLLIN, 0};
  if (sys::wait(&p, 1, 0) <= 0 || !(p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) return true;
  if (!rx_ring_.load(std::memory_order_acquire)) return false;
  poll_events(POLLIN, p.revents);  // flags it again if the lock is still held
  return !control_unsettled();
}

bool Connection::setup_read_elsewhere() {
  if (passthrough() || rx_ring_.load(std::memory_order_acquire)) return false;
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  return !rx.owns_lock();  // once free, the switch is done and rx_ring_ says so
}

// Before the ring, the bytes that make the TCP socket readable may all be
// ours (a Hello, an Ack, a frame header, a Switch). The kernel never wakes a
// reader for nothing, so neither may we: consume what is ours, never the
// application's bytes, and report POLLIN only if its read will find some.
// Never blocks: if another thread holds a lock, it is settling this itself.
short Connection::consume_setup_bytes(short kernel) {
  RDMASHIM_SCHED_POINT(kReadinessConsume);
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  std::unique_lock<std::mutex> tx(tx_mu_, std::defer_lock);
  control_unsettled_.store(!rx.owns_lock() || !tx.try_lock(), std::memory_order_relaxed);
  if (control_unsettled()) return kernel;
  tx_held_ = true;
  bool consumed = false, readable = true;
  for (int turn = 0; turn < 16; ++turn) {
    int r;
    if (rx_ == Rx::kDetectHello) {
      r = detect_hello(MSG_DONTWAIT, false);
      // A plain client: its bytes (or its end) were only peeked at, and the
      // kernel's word on them stands; asking again would cost a call.
      if (r == 0 && rx_ == Rx::kRaw) break;
    } else if (rx_ == Rx::kAwaitAck) {
      r = await_ack(MSG_DONTWAIT, false);
    } else if (rx_ == Rx::kFramed && rx_frame_left_ == 0) {
      r = read_frame(MSG_DONTWAIT);
      if (r == 0) break;  // EOF at a frame boundary: the read returns 0
      if (r > 0) r = 0;
    } else {
      break;
    }
    if (r == -EAGAIN || r == -EWOULDBLOCK) {
      readable = false;  // only a part of something of ours is here
      break;
    }
    if (r < 0) break;  // an error the application's read will see
    consumed = true;
  }
  tx_held_ = false;
  constexpr short kIn = POLLIN | POLLRDNORM;
  if (!readable) return static_cast<short>(kernel & ~kIn);
  if (consumed && rx_ != Rx::kRing) {
    pollfd p{fd_, kIn, 0};
    sys::wait(&p, 1, 0);
    kernel = static_cast<short>((kernel & ~kIn) | (p.revents & kIn));
  }
  return kernel;
}

short Connection::kernel_interest(short want) const {
  short k = 0;
  if (!rx_ring_.load(std::memory_order_acquire)) {
    k |= want & (POLLIN | POLLRDNORM | POLLPRI | POLLRDHUP);
  } else if (!rx_end_.load(std::memory_order_acquire) && !end_pending_.load(std::memory_order_relaxed)) {
    k |= POLLIN;  // control frames, FIN, RST; after the end (or a FIN) it would stay readable forever
  }
  if (!tx_ring_.load(std::memory_order_acquire)) {
    short out = want & (POLLOUT | POLLWRNORM | POLLWRBAND);
    // A held first write waits for the Hello (or the client's end), not for
    // room: the TCP side is writable all along.
    if (out && hold_until_ns_.load(std::memory_order_relaxed) > kHoldOver && holding(now_ns())) {
      k |= POLLIN | POLLRDHUP;
    } else {
      k |= out;
    }
  }
  return k;
}

int Connection::doorbell() {
  std::lock_guard<std::mutex> lock(wake_mu_);
  return wake_fd_;
}

unsigned Connection::arms_for(short events) {
  return ((events & (POLLIN | POLLRDNORM)) ? Link::kWaitData : 0u) |
         ((events & (POLLOUT | POLLWRNORM)) ? Link::kWaitSpace : 0u);
}
// Only called while on_ring(): the transport then lives as long as we do.
unsigned Connection::arm(short events) {
  unsigned what = arms_for(events);
  transport_->link().prepare_sleep(what);
  note_maintenance();  // an offer that woke this sleeper is adopted before the next sleep
  return what;
}
void Connection::watch_switch(const std::shared_ptr<Kick>& kick) {
  // The same waiter at every sleep (an event loop): it stays listed until the Switch.
  if (last_watcher_.load(std::memory_order_relaxed) == kick.get()) return;
  std::lock_guard<std::mutex> lock(wake_mu_);
  // Paired with kick_switch_watchers: it sees us listed, or we see the ring.
  last_watcher_.store(kick.get(), std::memory_order_seq_cst);
  if (rx_ring_.load(std::memory_order_seq_cst)) return;  // the waiter sees it on the ring
  if (!switch_watcher_ || switch_watcher_ == kick) {
    switch_watcher_ = kick;
    return;
  }
  for (const auto& k : more_switch_watchers_)
    if (k == kick) return;
  more_switch_watchers_.push_back(kick);
}

// rx just went on the ring: the waiters that slept before, counting on the
// Switch's TCP edge that our read has just spent, come back and arm.
void Connection::kick_switch_watchers() {
  if (last_watcher_.load(std::memory_order_seq_cst) == nullptr) return;  // nobody ever watched
  std::shared_ptr<Kick> first;
  std::vector<std::shared_ptr<Kick>> more;
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    first.swap(switch_watcher_);
    more.swap(more_switch_watchers_);
  }
  if (first) first->ring();
  for (const auto& k : more) k->ring();
}

void Connection::disarm(unsigned armed, bool rung) { transport_->link().finish_sleep(armed, rung); }
void Connection::disarm_edge(unsigned armed) { transport_->link().finish_edge_sleep(armed); }

// Bit 62 marks "on the ring": the ring's tail and the TCP side's count of
// EAGAINs are different counters, and the same number in both would hide
// the first bytes on the ring from an edge-triggered waiter that last looked
// on TCP (a reply framed over TCP, then one byte on the ring: a hang).
uint64_t Connection::rx_progress() const {
  if (!rx_ring_.load(std::memory_order_acquire)) return rx_again_.load(std::memory_order_relaxed);
  return ring_->link().peer_tail() + (uint64_t{1} << 62) +
         (rx_end_.load(std::memory_order_relaxed) ? (uint64_t{1} << 63) : 0);
}

// Bit 63 marks "on the ring", so a caller can tell the switch itself from
// a write that found the ring full.
uint64_t Connection::tx_progress() const {
  return tx_ring_.load(std::memory_order_acquire) ? tx_full_.load(std::memory_order_relaxed) | (uint64_t{1} << 63)
                                                  : tx_again_.load(std::memory_order_relaxed);
}

int64_t Connection::unread_bytes() {
  if (!rx_ring_.load(std::memory_order_acquire)) return unread_before_ring();
  if (shut_tail_.load(std::memory_order_relaxed) != UINT64_MAX && abort_if_data_after_shutdown()) {
    uint64_t pos = ring_->link().own_head(), end = shut_tail_.load(std::memory_order_acquire);
    return pos < end ? static_cast<int64_t>(end - pos) : 0;
  }
  return static_cast<int64_t>(ring_->unread_hint());
}

// Before the ring the kernel's count holds the handshake's bytes (an Ack of
// 64 bytes right after connect(); wrk then reads and fails), or frame
// headers: what a read would return at once, advancing the handshake as a
// non-blocking read would. A reader in the middle of a call holds rx_mu_:
// 0 then, as if the bytes had not come yet (never more than a read gives).
int64_t Connection::unread_before_ring() {
  std::unique_lock<std::mutex> lock(rx_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return 0;
  follow_sibling_switch_rx();
  if (rx_ == Rx::kDetectHello) (void)detect_hello(MSG_DONTWAIT, false);
  else if (rx_ == Rx::kAwaitAck) (void)await_ack(MSG_DONTWAIT, false);
  int queued = 0;
  switch (rx_) {
    case Rx::kRaw:
      return -1;
    case Rx::kRing:
      lock.unlock();
      return rx_ring_.load(std::memory_order_acquire) ? unread_bytes() : 0;
    case Rx::kFramed:
      if (rx_frame_left_ == 0 || sys::real().ioctl(fd_, FIONREAD, &queued) != 0 || queued < 0) return 0;
      return std::min<int64_t>(rx_frame_left_, queued);
    case Rx::kDetectHello:
    case Rx::kAwaitAck:
      break;
  }
  return 0;  // a handshake message not whole yet
}

int64_t Connection::unsent_bytes() const {
  return tx_ring_.load(std::memory_order_acquire) ? static_cast<int64_t>(ring_->unacked_hint()) : -1;
}

}  // namespace rdmashim
