// Fork and exec: settling a handshake before either, sharing a connection
// with a forked child (the cross-process side locks, following a switch a
// sibling made), and describing a connection for the next program image and
// adopting it there.
#include "conn/connection.h"

#include <cstdio>
#include <new>
#include <utility>

#include "shm/shm_transport.h"
#include "util/config.h"
#include "util/log.h"

namespace rdmashim {

void Connection::settle_before_fork() {
  forked_.store(true, std::memory_order_relaxed);
  if (io_started_.load(std::memory_order_relaxed)) settle_handshake();
  if (transport_ && !transport_->survives_fork()) (void)hand_over_ring(wire::kDowngradeFork);
  // The child counts as a user from before the fork: a parent that closes
  // its copy at once (before the child's handler ran) must already see the
  // ring shared, or it gives the ring's pages back under the child. (A fork
  // that fails leaves one user too many: the side locks are then taken
  // for nothing, and its pages stay until close.)
  if (transport_ && transport_->survives_fork()) {
    transport_->add_user();
    user_added_for_fork_ = true;
  }
}

void Connection::settle_handshake() {
  if (!in_setup_.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock()) return;
  std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);
  if (!tx.owns_lock()) return;
  rx.unlock();
  tx.unlock();
  finish_setup(static_cast<int>(config().setup_timeout_ms));
}

void Connection::settle_before_sandbox() {
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  if (in_setup_.load(std::memory_order_relaxed)) {
    if (role_ == Role::kClient || io_started_.load(std::memory_order_relaxed)) {
      settle_handshake();  // the Ack of an rdmashim server is on its way: bounded by the setup timeout
    } else {
      finish_setup(0);     // an untouched server: only a Hello already here
    }
  }
  prime_options();
}

// Text: role/rx/tx/want/flags/final/transport, e.g. "s/R/F/R/0/0/shm/1/7/8/9/262144".
std::string Connection::describe_for_exec() {
  settle_handshake();
  std::lock_guard<std::mutex> rx(rx_mu_);
  std::lock_guard<std::mutex> tx(tx_mu_);
  bool clean = rx_hdr_have_ == 0 && rx_frame_left_ == 0 && tx_hdr_left_ == 0 && tx_frame_left_ == 0;
  // tx raw: it left its ring (a downgrade, or a verbs hand-over: handover.cc).
  bool tx_left = tx_ == Tx::kRaw && (down_dirs_.load(std::memory_order_relaxed) & kLeftTx);
  bool modes = (rx_ == Rx::kFramed || rx_ == Rx::kRing) && (tx_ == Tx::kFramed || tx_ == Tx::kRing || tx_left) &&
               tx_want_ != TxWant::kPlain;
  if (!transport_ || !ring_ || !clean || !modes) return "";
  std::string t = transport_->describe_for_exec();
  if (t.empty()) return "";
  // Bits 8-15: the downgrade's reason; 16: the peer reads Downgrade frames;
  // 32: the ring holds what a verbs ring had not delivered (counted as verbs).
  unsigned flags = (tcp_eof_ ? 1u : 0u) | (peer_closed_ ? 2u : 0u) | (tx_shut_ ? 4u : 0u) | (rx_shut_ ? 8u : 0u) |
                   (peer_downgrades_.load(std::memory_order_relaxed) ? 16u : 0u) |
                   (outcome_ == stats::Outcome::kVerbs ? 32u : 0u) |
                   (unsigned{down_reason_.load(std::memory_order_relaxed)} << 8);
  char head[96];
  snprintf(head, sizeof head, "%c/%c/%c/%c/%u/%llu/", role_ == Role::kClient ? 'c' : 's',
           rx_ == Rx::kRing ? 'R' : 'F', tx_ == Tx::kRing ? 'R' : tx_left ? 'T' : 'F',
           tx_want_ == TxWant::kRing ? 'R' : '-', flags, static_cast<unsigned long long>(peer_final_));
  return head + t;
}

std::unique_ptr<Connection> Connection::adopt_described(int fd, const char* text) {
  char role, rx, tx, want;
  unsigned flags = 0;
  unsigned long long final_pos = 0;
  int used = 0;
  if (sscanf(text, "%c/%c/%c/%c/%u/%llu/%n", &role, &rx, &tx, &want, &flags, &final_pos, &used) != 6 || used == 0 ||
      (role != 'c' && role != 's')) {
    return nullptr;
  }
  int err = 0;
  auto t = shm::ShmTransport::adopt(text + used, &err);
  if (!t) return nullptr;
  std::unique_ptr<Connection> c(
      new (std::nothrow) Connection(fd, role == 'c' ? Role::kClient : Role::kServer));
  if (!c) return nullptr;
  c->adopt(std::move(t));
  if (!c->ring_) return nullptr;
  c->ring_->resync_rx();
  c->ring_->resync_tx();
  c->rx_ = rx == 'R' ? Rx::kRing : Rx::kFramed;
  c->tx_ = tx == 'R' ? Tx::kRing : tx == 'T' ? Tx::kRaw : Tx::kFramed;
  c->peer_downgrades_.store(flags & 16u);
  c->down_reason_.store(static_cast<uint8_t>(flags >> 8));
  if (tx == 'T') c->down_dirs_.store(kLeftTx);
  uint64_t left_at = 0;
  if (c->rx_ == Rx::kRing && c->transport_->rx_left(&left_at)) {  // the peer's ring stream ends there
    c->rx_down_pos_ = left_at;
    c->rx_leaving_.store(true);
  }
  c->tx_want_ = want == 'R' ? TxWant::kRing : TxWant::kNone;
  c->rx_ring_.store(c->rx_ == Rx::kRing);
  c->tx_ring_.store(c->tx_ == Tx::kRing);
  c->tcp_eof_ = flags & 1u;
  c->peer_closed_ = flags & 2u;
  c->peer_final_ = final_pos;
  c->tx_shut_.store(flags & 4u);
  c->rx_shut_.store(flags & 8u);
  const bool awaiting = c->awaiting_end();  // announced writes still on their way
  c->end_pending_.store(c->tcp_eof_ && awaiting);
  c->rx_end_.store(((c->tcp_eof_ || c->peer_closed_) && !awaiting) || (flags & 8u));
  c->peer_wr_shut_.store(c->tcp_eof_ || c->peer_closed_);
  c->tcp_done_.store(c->tcp_eof_);
  c->in_setup_.store(false);
  c->io_started_.store(true);
  c->settled_ = true;
  c->outcome_ = (flags & 32u) ? stats::Outcome::kVerbs : stats::Outcome::kShm;
  c->stat_row_.open(fd, c->outcome_, role == 's', c->ring_->link().ring_size());
  RDMASHIM_INFO("fd %d (%s) -> %s (inherited across exec%s)", fd, role == 'c' ? "client" : "server",
                (flags & 32u) ? "verbs" : "shm", (flags & 32u) ? ", its unread bytes held: tcp:downgraded:exec" : "");
  return c;
}

// A sibling passed the Switch: it read (or wrote) every framed byte before
// it, so whatever frame this process was in the middle of when it forked is
// stale (sshd's monitor forks while a DATA frame of the client's is half
// read, and takes the stream back after the pre-authentication child left).
void Connection::follow_sibling_switch_rx() {
  if (rx_ == Rx::kFramed && ring_ && transport_->switched(Transport::Dir::kRx)) {
    rx_frame_left_ = rx_hdr_have_ = rx_ctl_have_ = 0;
    rx_ = Rx::kRing;
    rx_ring_.store(true, std::memory_order_release);
  }
}

void Connection::follow_sibling_switch_tx() {
  if (tx_ == Tx::kFramed && ring_ && transport_->switched(Transport::Dir::kTx)) {
    tx_frame_left_ = tx_hdr_left_ = 0;
    tx_ = Tx::kRing;
    tx_want_ = TxWant::kNone;
    tx_ring_.store(true, std::memory_order_release);
  }
}

// Readiness too: a process that only waits (poll) must see the ring a
// sibling switched to, not the quiet TCP side. Never blocks.
void Connection::follow_sibling_switches() {
  if (!rx_ring_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
    if (rx.owns_lock() && transport_) follow_sibling_switch_rx();
  }
  if (!tx_ring_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);
    if (tx.owns_lock() && transport_) follow_sibling_switch_tx();
  }
}

void Connection::on_fork_child() {
  // The cached options stay true (one open file): a sibling that changes
  // them moves the transport's options generation (see cacheable()).
  forked_.store(true, std::memory_order_relaxed);
  (void)retired_ring_.release();  // a verbs transport the hand-over replaced: the parent's
  (void)retired_.release();
  if (!transport_) return;
  if (transport_->survives_fork()) {
    if (!user_added_for_fork_) transport_->add_user();  // (a test forking by itself)
    user_added_for_fork_ = false;
    return;
  }
  // The parent's transport is neither used nor destroyed here (see
  // ~Connection). Off its ring (handed over before the fork: handover.cc)
  // the stream is plain TCP, here as there; else it stays the parent's and
  // reads as reset here.
  parents_transport_ = true;
  if (passthrough()) return;
  orphaned_ = true;
  rx_ring_.store(false, std::memory_order_relaxed);  // no waiting on its doorbell either
  tx_ring_.store(false, std::memory_order_relaxed);
  tcp_done_.store(true, std::memory_order_relaxed);
  peer_gone_.store(true, std::memory_order_relaxed);
  rx_end_.store(true, std::memory_order_release);
}

Connection::SideLock::SideLock(Connection& c, Transport::Dir d) : c_(c), d_(d) { reacquire(); }
Connection::SideLock::~SideLock() { release(); }

void Connection::SideLock::release() {
  if (held_) c_.transport_->unlock(d_);
  held_ = false;
}

void Connection::SideLock::reacquire() {
  if (c_.transport_->shared()) {
    c_.transport_->lock(d_);
    held_ = true;
  } else if (!c_.transport_->ever_shared()) {
    return;
  }
  // A sibling (maybe gone by now: sshd's pre-authentication child) moved them.
  if (d_ == Transport::Dir::kRx) c_.ring_->resync_rx();
  else c_.ring_->resync_tx();
}

}  // namespace rdmashim
