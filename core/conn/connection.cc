// The Connection itself: construction, destruction, the state it settles
// into, shutdown and close, and what the other parts share (the socket's
// cached flags and timeouts, and the error paths). The handshake, fork/exec,
// readiness and the data path each have their own file beside this one.
#include "conn/connection.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "conn/connection_internal.h"
#include "conn/deferred_close.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/process.h"
#include "util/schedule.h"
#include "verbs/verbs_transport.h"

namespace rdmashim {
namespace conn_internal {

// Sends all of buf, waiting for room up to the setup timeout even on a
// non-blocking socket: used only for rdmashim's own small messages.
int send_all(int fd, const void* buf, size_t len) {
  const auto* p = static_cast<const char*>(buf);
  uint64_t give_up = now_ns() + uint64_t{config().setup_timeout_ms} * 1'000'000;
  while (len > 0) {
    ssize_t n = sys::real().send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -errno;
    uint64_t now = now_ns();
    if (now >= give_up) return -ETIMEDOUT;
    pollfd p1{fd, POLLOUT, 0};
    sys::real().poll(&p1, 1, static_cast<int>((give_up - now) / 1'000'000) + 1);
  }
  return 0;
}

}  // namespace conn_internal

// ---------------------------------------------------------------------------
// Creation

Connection::Connection(int fd, Role role)
    : fd_(fd),
      role_(role),
      rx_(role == Role::kClient ? Rx::kAwaitAck : Rx::kDetectHello),
      tx_(role == Role::kClient ? Tx::kFramed : Tx::kUndecided) {}

Connection::~Connection() {
  if (idle_listed_.load(std::memory_order_relaxed)) forget_idle();
  if (parents_transport_) {
    (void)ring_.release();  // both are the parent's copies; leaked on purpose
    (void)transport_.release();
    return;
  }
  forget_exit_notice();  // before any member goes: the exit's flush may be calling
  if (transport_) transport_->remove_user();
}

void Connection::forget_exit_notice() {
  if (transport_) transport_->link().set_exit_notice({});
  if (retired_) retired_->link().set_exit_notice({});
}

void Connection::cut_at_exit(void* self) {
  auto* c = static_cast<Connection*>(self);
  std::unique_lock<std::mutex> tx(c->tx_mu_, std::try_to_lock);
  if (!tx.owns_lock() || c->tx_ != Tx::kRing || c->tx_shut_.load(std::memory_order_relaxed)) return;
  c->cut_unconfirmed(c->fd());
}

std::unique_ptr<Connection> Connection::make_server(int fd, bool syn_kept, bool blocking) {
  std::unique_ptr<Connection> c(new (std::nothrow) Connection(fd, Role::kServer));
  if (c) {
    c->syn_kept_ = syn_kept;
    c->blocks_.store(blocking, std::memory_order_relaxed);
  }
  return c;
}

const char* Connection::transport_name() const { return stats::name(outcome_); }

void Connection::settle(stats::Outcome o, bool correct) {
  bool upgraded = outcome_ == stats::Outcome::kShm || outcome_ == stats::Outcome::kVerbs;
  if (settled_ && !(correct && upgraded)) return;
  announce_.withdraw(fd_);  // a server waiting for our Hello has it, or need not wait
  if (settled_) stats::uncount(outcome_);
  stats::count(o);
  if (settled_) stat_row_.set_outcome(o);
  else stat_row_.open(fd(), o, role_ == Role::kServer, ring_ ? ring_->link().ring_size() : 0);
  settled_ = true;
  outcome_ = o;
  const char* role = role_ == Role::kClient ? "client" : "server";
  if (detail_) RDMASHIM_INFO("fd %d (%s) -> %s (%s)", fd(), role, stats::name(o), detail_);
  else RDMASHIM_INFO("fd %d (%s) -> %s", fd(), role, stats::name(o));
}

std::unique_lock<std::mutex> Connection::lock_tx_for_handler() {
  std::unique_lock<std::mutex> tx(tx_mu_, std::defer_lock);
  if (!tx_held_) tx.lock();
  return tx;
}

// Both locks held.
void Connection::update_passthrough() {
  if (rx_ == Rx::kRaw && tx_ == Tx::kRaw) {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      wake_fd_ = -1;
    }
    ring_.reset();
    transport_.reset();
    rendezvous_fd_.reset();
    segment_fds_.reset();
    passthrough_.store(true, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------------------
// Shutdown and close

Connection::Drain Connection::drain_before_close(unsigned avoid_first, unsigned avoid_last) {
  if (orphaned_) return Drain::kClose;  // the TCP side's frames are the parent's
  forget_exit_notice();  // from here the close's own flush decides
  RDMASHIM_SCHED_POINT(kCloseDrain);
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  int flushed = flush_tx(true);
  bool held = drain_rx(avoid_first, avoid_last);
  if (!flush_pending_) {
    if (flushed == -ETIMEDOUT) cut_unconfirmed(fd());
    return held ? Drain::kHeld : Drain::kClose;
  }
  if (held) {  // one hold per socket (cannot happen: a ring means the Ack came)
    finish_flush();
    return Drain::kHeld;
  }
  if (rst_on_close_) {  // the reset drops what is in flight, as TCP's would
    flush_pending_ = false;
    return Drain::kClose;
  }
  return Drain::kFlushing;
}

void Connection::finish_flush() {
  if (!flush_pending_ || !transport_) return;
  flush_pending_ = false;
  uint64_t now = now_ns();
  int left = now < close_deadline_ ? static_cast<int>((close_deadline_ - now + 999'999) / 1'000'000) : 0;
  int r = flush_watched(left, true);
  if (r != 0) RDMASHIM_DEBUG("fd %d: ring writes not confirmed before close: %s", fd(), strerror(-r));
  if (r == -ETIMEDOUT) cut_unconfirmed(fd());
}

// A close that gives up on its verbs writes lets its QP go with them: the
// peer must not read the FIN as the end of a whole stream. The reset says
// it was cut (what landed can still be read first).
void Connection::cut_unconfirmed(int fd) {
  // Not a socket another process still uses (the option is the socket's).
  if (rst_on_close_ || !transport_ || transport_->shared() || forked_.load(std::memory_order_relaxed)) return;
  if (resend_unconfirmed(fd)) return;
  linger lg{1, 0};
  rst_on_close_ = sys::real().setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0;
  RDMASHIM_DEBUG("fd %d: ring writes not confirmed by the close's deadline: reset", fd);
}

bool Connection::linger_step(int fd, bool last) {
  if (!transport_) return true;
  int r = transport_->link().flush(0);
  if (r != -ETIMEDOUT) return true;  // confirmed, the peer said Bye, or the link failed
  if (last) {
    cut_unconfirmed(fd);
    return true;
  }
  // The peer gone (a reset; a hang-up before our FIN; after its FIN, a ping
  // its kernel answers with RST), as flush_tx's watch tells.
  pollfd p{fd, POLLRDHUP, 0};
  if (sys::real().poll(&p, 1, 0) != 1) return false;
  bool gone = (p.revents & POLLERR) || (linger_open_ && (p.revents & POLLHUP));
  if (!gone && linger_open_ && !close_pinged_ && (p.revents & POLLRDHUP)) {
    close_pinged_ = true;
    wire::FrameHeader h{0, static_cast<uint16_t>(wire::FrameType::kPing), 0};
    ssize_t n = sys::real().send(fd, &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
    gone = n < 0 && (errno == EPIPE || errno == ECONNRESET);
  }
  // Its QP is gone too: the link's last words (a Bye) would only be retried.
  if (gone) transport_->link().peer_lost();
  return gone;
}

// drain_before_close without the flush: true if deferred_close holds the socket.
bool Connection::drain_rx(unsigned avoid_first, unsigned avoid_last) {
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock()) return false;
  discard_unread_handshake();
  // Our Hello is out and its Ack not here yet: on a closed socket it would
  // draw an RST. Held until it came (unless another process has the socket:
  // it may still read the Ack, and our close sends no FIN then).
  if (role_ == Role::kClient && rx_ == Rx::kAwaitAck && !forked_.load(std::memory_order_relaxed) &&
      deferred_close::hold(fd(), nonce_, std::move(rendezvous_fd_), avoid_first, avoid_last)) {
    announce_.name.reset();  // closed, not just shut down: a server that sees this sends no Ack
    return true;
  }
  // A DATA header is left for a sibling process that still reads the stream:
  // peek first. A read/write program that shares nothing takes frames as
  // they come (a DATA payload left unread resets the close, as on TCP).
  bool peek = !sys::file_calls(sys::current_calls()) || !transport_ || transport_->shared();
  while (rx_ == Rx::kFramed && rx_frame_left_ == 0 && rx_hdr_have_ == 0) {
    wire::FrameHeader h{};
    if (peek) {
      ssize_t n = sys::real().recv(fd(), &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
      if (n != static_cast<ssize_t>(sizeof h) || !wire::valid(h) ||
          h.type == static_cast<uint16_t>(wire::FrameType::kData)) {
        break;
      }
    }
    if (read_frame(MSG_DONTWAIT) <= 0) break;
  }
  if (rx_ == Rx::kRing || tx_ == Tx::kRing) {
    // Nobody reads our rx ring after this; give back what the peer drained.
    std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);
    if (tx.owns_lock() && ring_ && transport_ && !transport_->shared()) ring_->release_tx();
    release_rx_for_good();
  }
  if (rx_ == Rx::kRing) {
    poll_control();
    // Closing with unread data resets the connection. On a ring that data is
    // not in the socket, so ask the kernel for the RST; unless another process
    // shares the ring and may still read it.
    if (ring_ && !transport_->shared() && ring_->readable() > 0) {
      linger lg{1, 0};
      rst_on_close_ = sys::real().setsockopt(fd(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0;
    }
  }
  // Anything still unread makes the kernel answer our close with RST.
  int left = 0;
  if (log::enabled(3) && sys::real().ioctl(fd(), FIONREAD, &left) == 0 && left > 0) {
    RDMASHIM_DEBUG("fd %d: closing with %d unread TCP bytes (rx %d, tx %d, frame_left %u, hdr %u)", fd(), left,
               static_cast<int>(rx_), static_cast<int>(tx_), rx_frame_left_, rx_hdr_have_);
  }
  return false;
}

// Our ring writes in flight must land before the peer sees our FIN or Close.
// Unless the peer is gone (a SIGKILLed process, a crashed one): then nothing
// confirms them, and a close on TCP would not wait either. The TCP side
// tells: a reset (POLLERR), or, once the peer's FIN came (a closed socket
// always sent one), a ping that its kernel answers with RST. Never before
// the FIN (see wait_ring), nor after our own (the ping would fail, the
// reset is no news), nor in shutdown() (the RST would fail its call).
int Connection::flush_tx(bool closing) {
  if (!tx_ring_.load(std::memory_order_acquire) || !transport_) return 0;
  const int timeout = static_cast<int>(config().setup_timeout_ms);
  const uint64_t now = now_ns();
  close_deadline_ = now + uint64_t{config().setup_timeout_ms} * 1'000'000;
  linger_deadline_ = now + kLingerNs;
  // A close whose flush can end in the background waits here only as long as
  // a live peer takes to confirm; one that stopped answering (its host
  // crashed or unreachable: no reset comes) no longer holds close() for the
  // setup timeout. Not where no background thread may run (a sandbox), nor
  // for a ring another process shares.
  const bool may_linger = closing && transport_->link().flush_lingers() && !transport_->shared() &&
                          !forked_.load(std::memory_order_relaxed) && sandbox() == Sandbox::kNone;
  int r = flush_watched(may_linger ? std::min(timeout, kCloseFlushMs) : timeout, closing);
  if (r == -ETIMEDOUT && may_linger) {
    flush_pending_ = true;
    return r;
  }
  if (r != 0) RDMASHIM_DEBUG("fd %d: ring writes not confirmed before close: %s", fd(), strerror(-r));
  return r;
}

void Connection::announce_end() {
  if (end_announced_ || !ring_) return;
  end_announced_ = true;
  uint64_t end = ring_->tx_position();
  int r = send_control(wire::FrameType::kClose, &end, sizeof end);
  RDMASHIM_DEBUG("fd %d: ring writes up to %llu not confirmed before our FIN: Close frame %s", fd(),
                 static_cast<unsigned long long>(end), r == 0 ? "sent" : "failed");
}

int Connection::flush_watched(int timeout_ms, bool closing) {
  struct Watch {
    Connection* c;
    bool open;  // our side sent no FIN: a hang-up (POLLHUP) is a reset
    bool ping;
    static bool peer_gone(void* ctx) {
      Watch& w = *static_cast<Watch*>(ctx);
      pollfd p{w.c->fd(), POLLRDHUP, 0};
      sys::WaitCall how = sys::wait_call();  // the program's (select shows no hang-up or error)
      if (sys::wait_as(sys::select_like(how) ? sys::WaitCall::kPoll : how, &p, 1, 0) != 1) return false;
      if ((p.revents & POLLERR) || (w.open && (p.revents & POLLHUP))) return true;
      if (!w.ping || !(p.revents & POLLRDHUP)) return false;
      w.ping = false;  // once: the answer takes a round trip
      std::unique_lock<std::mutex> tx(w.c->tx_mu_, std::try_to_lock);  // frames stay whole on the TCP side
      if (!tx.owns_lock()) return false;
      int r = w.c->send_control(wire::FrameType::kPing, nullptr, 0);
      return r == -EPIPE || r == -ECONNRESET;
    }
  };
  const bool no_fin = !tx_shut_.load(std::memory_order_relaxed);
  Watch state{this, no_fin, no_fin && !close_pinged_};
  Link::PeerWatch watch{&Watch::peer_gone, &state};
  int r = transport_->link().flush(timeout_ms, closing ? &watch : nullptr);
  if (no_fin && !state.ping) close_pinged_ = true;
  linger_open_ = no_fin;
  return r;
}

int Connection::shutdown(int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  if (how != SHUT_RD) {
    // A writer of ours blocked on a full ring sees tx_shut_ soon. The FIN alone ends the
    // stream, as for close(): no Close frame once our writes are confirmed,
    // because the peer may already have read all it wanted and closed, and
    // bytes landing on its closed socket make its kernel answer with RST
    // (our shutdown() would then fail with ENOTCONN and our reads see
    // ECONNRESET instead of EOF).
    tx_shut_.store(true, std::memory_order_relaxed);  // a writer waiting on the ring looks every kSelfWakeMs
    std::lock_guard<std::mutex> tx(tx_mu_);
    if (tx_ == Tx::kRing) {
      // The FIN must not overtake the data. Writes a reader away from its
      // socket leaves in our send queue land once it is back: the Close
      // frame tells it to wait for them rather than end at our FIN.
      if (flush_tx() == -ETIMEDOUT) announce_end();
    } else if (tx_ == Tx::kUndecided) {
      tx_ = Tx::kRaw;
    }
  }
  if (how != SHUT_WR) {
    rx_shut_.store(true, std::memory_order_relaxed);
    rx_end_.store(true, std::memory_order_release);  // a reader waiting on the ring wakes at our shutdown below
  }
  if (rx_shut_.load() && tx_shut_.load() && rx_ring_.load(std::memory_order_acquire) &&
      shut_tail_.load(std::memory_order_relaxed) == UINT64_MAX) {
    shut_tail_.store(ring_->link().peer_tail(), std::memory_order_release);
  }
  RDMASHIM_SCHED_POINT(kShutdownFin);
  int r = sys::real().shutdown(fd_, how);
  return r == 0 ? 0 : -errno;
}

// ---------------------------------------------------------------------------
// The socket's flags and timeouts, and errors

// O_NONBLOCK, the timeouts and SO_RCVLOWAT are asked of the kernel once
// (prime_options, right after the handshake) and then kept: what the program
// changes goes through our hooks, which keep the new value. After fork a
// sibling's change moves the transport's generation; the others ask again.
bool Connection::cacheable() const {
  if (!transport_) return false;
  if (transport_->shared()) {
    uint32_t g = transport_->options_generation();
    if (g != options_gen_.load(std::memory_order_relaxed)) {
      options_gen_.store(g, std::memory_order_relaxed);
      nonblock_.store(-1, std::memory_order_relaxed);
      rcvtimeo_ns_.store(-1, std::memory_order_relaxed);
      sndtimeo_ns_.store(-1, std::memory_order_relaxed);
      rcvlowat_.store(-1, std::memory_order_relaxed);
    }
  }
  return true;
}

void Connection::options_shared_changed() {
  if (transport_ && transport_->shared()) {
    options_gen_.store(transport_->bump_options_generation(), std::memory_order_relaxed);
  }
}

void Connection::file_flags_changed(int nonblock) {
  nonblock_.store(nonblock, std::memory_order_relaxed);
  blocks_.store(nonblock == 0, std::memory_order_relaxed);
  options_shared_changed();
}

void Connection::timeouts_changed(int optname, int64_t ns) {
  if (optname != SO_SNDTIMEO) rcvtimeo_ns_.store(optname == SO_RCVTIMEO ? ns : -1, std::memory_order_relaxed);
  if (optname != SO_RCVTIMEO) sndtimeo_ns_.store(optname == SO_SNDTIMEO ? ns : -1, std::memory_order_relaxed);
  options_shared_changed();
}

void Connection::prime_options() {
  if (!cacheable() || !ring_) return;
  (void)nonblocking(0);
  (void)deadline(SO_RCVTIMEO);
  (void)deadline(SO_SNDTIMEO);
  (void)rcvlowat();
}

bool Connection::nonblocking(int flags) const {
  if (flags & MSG_DONTWAIT) return true;
  bool cache = cacheable();
  int nb = cache ? nonblock_.load(std::memory_order_relaxed) : -1;
  if (nb < 0) {
    int fl = sys::real().fcntl(fd_, F_GETFL);
    nb = fl >= 0 && (fl & O_NONBLOCK) ? 1 : 0;
    if (cache) nonblock_.store(nb, std::memory_order_relaxed);
  }
  return nb != 0;
}

int64_t Connection::deadline(int optname) const {
  auto& cached = optname == SO_RCVTIMEO ? rcvtimeo_ns_ : sndtimeo_ns_;
  bool cache = cacheable();
  int64_t ns = cache ? cached.load(std::memory_order_relaxed) : -1;
  if (ns < 0) {
    timeval tv{};
    socklen_t len = sizeof tv;
    ns = sys::real().getsockopt(fd_, SOL_SOCKET, optname, &tv, &len) != 0
             ? 0
             : tv.tv_sec * 1'000'000'000LL + tv.tv_usec * 1000LL;
    if (cache) cached.store(ns, std::memory_order_relaxed);
  }
  return ns == 0 ? kNoDeadline : static_cast<int64_t>(now_ns()) + ns;
}

// The peer broke the protocol (or its memory): the stream cannot be trusted
// any more. Both directions end as with a reset.
int Connection::broken(const char* what) {
  RDMASHIM_WARN("fd %d: peer protocol error (%s); resetting the connection", fd(), what);
  linger lg{1, 0};
  sys::real().setsockopt(fd_, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  sys::real().shutdown(fd_, SHUT_RDWR);
  tcp_eof_ = true;
  tcp_done_.store(true, std::memory_order_relaxed);
  peer_gone_.store(true, std::memory_order_relaxed);
  rx_end_.store(true, std::memory_order_release);
  return -ECONNRESET;
}

}  // namespace rdmashim
