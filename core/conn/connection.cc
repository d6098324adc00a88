#include "conn/connection.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <pthread.h>
#include <utility>

#include "discovery/registry.h"
#include "shm/shm_transport.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/process.h"
#include "util/signals.h"
#include "util/spin.h"
#include "util/user_copy.h"
#include "verbs/verbs_transport.h"

namespace rdmashim {
namespace {

constexpr int kMaxIov = 64;
// How long a server whose application writes first waits for a Hello that
// is on its way. A client under rdmashim sends it right after connect().
constexpr uint64_t kHelloGraceNs = 1'000'000;

ssize_t tcp_recv(int fd, const iovec* iov, int n, int flags) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = static_cast<size_t>(n);
  ssize_t r = sys::real().recvmsg(fd, &m, flags);
  return r < 0 ? -errno : r;
}

ssize_t tcp_send(int fd, const iovec* iov, int n, int flags) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = static_cast<size_t>(n);
  ssize_t r = sys::real().sendmsg(fd, &m, flags);
  return r < 0 ? -errno : r;
}

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

}  // namespace

// ---------------------------------------------------------------------------
// Creation

Connection::Connection(int fd, Role role)
    : fd_(fd),
      role_(role),
      rx_(role == Role::kClient ? Rx::kAwaitAck : Rx::kDetectHello),
      tx_(role == Role::kClient ? Tx::kFramed : Tx::kUndecided),
      created_ns_(now_ns()) {}

Connection::~Connection() {
  if (orphaned_) {
    (void)ring_.release();  // both are the parent's copies; leaked on purpose
    (void)transport_.release();
    return;
  }
  if (transport_) transport_->remove_user();
}

void Connection::settle_before_fork() {
  if (io_started_.load(std::memory_order_relaxed)) settle_handshake();
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

// Text: role/rx/tx/want/flags/final/transport, e.g. "s/R/F/R/0/0/shm/1/7/8/9/262144".
std::string Connection::describe_for_exec() {
  settle_handshake();
  std::lock_guard<std::mutex> rx(rx_mu_);
  std::lock_guard<std::mutex> tx(tx_mu_);
  bool clean = rx_hdr_have_ == 0 && rx_frame_left_ == 0 && tx_hdr_left_ == 0 && tx_frame_left_ == 0;
  bool modes = (rx_ == Rx::kFramed || rx_ == Rx::kRing) && (tx_ == Tx::kFramed || tx_ == Tx::kRing) &&
               tx_want_ != TxWant::kPlain;
  if (!transport_ || !ring_ || !clean || !modes) return "";
  std::string t = transport_->describe_for_exec();
  if (t.empty()) return "";
  unsigned flags = (tcp_eof_ ? 1u : 0u) | (peer_closed_ ? 2u : 0u) | (tx_shut_ ? 4u : 0u) | (rx_shut_ ? 8u : 0u);
  char head[96];
  snprintf(head, sizeof head, "%c/%c/%c/%c/%u/%llu/", role_ == Role::kClient ? 'c' : 's',
           rx_ == Rx::kRing ? 'R' : 'F', tx_ == Tx::kRing ? 'R' : 'F', tx_want_ == TxWant::kRing ? 'R' : '-', flags,
           static_cast<unsigned long long>(peer_final_));
  return head + t;
}

Connection* Connection::adopt_described(int fd, const char* text) {
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
  auto* c = new (std::nothrow) Connection(fd, role == 'c' ? Role::kClient : Role::kServer);
  if (!c) return nullptr;
  c->adopt(std::move(t));
  if (!c->ring_) {
    delete c;
    return nullptr;
  }
  c->ring_->resync_rx();
  c->ring_->resync_tx();
  c->rx_ = rx == 'R' ? Rx::kRing : Rx::kFramed;
  c->tx_ = tx == 'R' ? Tx::kRing : Tx::kFramed;
  c->tx_want_ = want == 'R' ? TxWant::kRing : TxWant::kNone;
  c->rx_ring_.store(c->rx_ == Rx::kRing);
  c->tx_ring_.store(c->tx_ == Tx::kRing);
  c->tcp_eof_ = flags & 1u;
  c->peer_closed_ = flags & 2u;
  c->peer_final_ = final_pos;
  c->tx_shut_.store(flags & 4u);
  c->rx_shut_.store(flags & 8u);
  c->rx_end_.store(c->tcp_eof_ || c->peer_closed_ || (flags & 8u));
  c->peer_wr_shut_.store(c->tcp_eof_ || c->peer_closed_);
  c->tcp_done_.store(c->tcp_eof_);
  c->in_setup_.store(false);
  c->io_started_.store(true);
  c->settled_ = true;
  c->outcome_ = stats::Outcome::kShm;
  RDMASHIM_INFO("fd %d (%s) -> shm (inherited across exec)", fd, role == 'c' ? "client" : "server");
  return c;
}

void Connection::drain_before_close() {
  if (orphaned_) return;  // the TCP side's frames are the parent's
  flush_tx();
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock()) return;
  while (rx_ == Rx::kFramed && rx_frame_left_ == 0 && rx_hdr_have_ == 0) {
    wire::FrameHeader h{};
    ssize_t n = sys::real().recv(fd(), &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(sizeof h) || !wire::valid(h) ||
        h.type == static_cast<uint16_t>(wire::FrameType::kData)) {
      break;
    }
    if (read_frame(MSG_DONTWAIT) <= 0) break;
  }
  if (rx_ == Rx::kRing) {
    poll_control();
    // Closing with unread data resets the connection. On a ring that data is
    // not in the socket, so ask the kernel for the RST; unless another process
    // shares the ring and may still read it.
    if (ring_ && !transport_->shared() && ring_->readable() > 0) {
      linger lg{1, 0};
      sys::real().setsockopt(fd(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
  }
  // Anything still unread makes the kernel answer our close with RST.
  int left = 0;
  if (log::enabled(3) && sys::real().ioctl(fd(), FIONREAD, &left) == 0 && left > 0) {
    RDMASHIM_DEBUG("fd %d: closing with %d unread TCP bytes (rx %d, tx %d, frame_left %u, hdr %u)", fd(), left,
               static_cast<int>(rx_), static_cast<int>(tx_), rx_frame_left_, rx_hdr_have_);
  }
}

// Our ring writes in flight must land before the peer sees our FIN or Close.
void Connection::flush_tx() {
  if (!tx_ring_.load(std::memory_order_acquire) || !transport_) return;
  int r = transport_->link().flush(static_cast<int>(config().setup_timeout_ms));
  if (r != 0) RDMASHIM_DEBUG("fd %d: ring writes not confirmed before close: %s", fd(), strerror(-r));
}

void Connection::follow_sibling_switch_rx() {
  if (rx_ == Rx::kFramed && rx_frame_left_ == 0 && rx_hdr_have_ == 0 && ring_ && transport_->switched(Transport::Dir::kRx)) {
    rx_ = Rx::kRing;
    rx_ring_.store(true, std::memory_order_release);
  }
}

void Connection::follow_sibling_switch_tx() {
  if (tx_ == Tx::kFramed && tx_frame_left_ == 0 && tx_hdr_left_ == 0 && ring_ &&
      transport_->switched(Transport::Dir::kTx)) {
    tx_ = Tx::kRing;
    tx_want_ = TxWant::kNone;
    tx_ring_.store(true, std::memory_order_release);
  }
}

void Connection::on_fork_child() {
  file_flags_changed();  // from now on another process can change them
  timeouts_changed();
  if (!transport_) return;
  if (transport_->survives_fork()) {
    transport_->add_user();
    return;
  }
  // The stream stays the parent's: here it reads as reset, and the parent's
  // transport is neither used nor destroyed (see ~Connection).
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
  if (!c_.transport_->shared()) return;
  c_.transport_->lock(d_);
  held_ = true;
  if (d_ == Transport::Dir::kRx) c_.ring_->resync_rx();
  else c_.ring_->resync_tx();
}


Connection* Connection::make_client(int fd) {
  if (!upgrades_allowed()) {
    stats::count(stats::Outcome::kTcpPolicy);
    return nullptr;
  }
  auto* c = new (std::nothrow) Connection(fd, Role::kClient);
  if (!c) return nullptr;
  // Shared memory to a peer on this host, verbs to one elsewhere (or to any
  // when RDMASHIM_TRANSPORT=verbs); both are offered, the server chooses.
  const Config& cfg = config();
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof local, plen = sizeof peer;
  bool same_host = sys::real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0 &&
                   discovery::is_local_address(reinterpret_cast<sockaddr*>(&peer), plen);
  uint32_t offer = 0;
  if (same_host && cfg.transport != TransportChoice::kVerbs) offer |= wire::kTransportShm;
  if (!same_host || cfg.transport == TransportChoice::kVerbs) {
    int err = 0;
    if (sys::real().getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0) {
      c->verbs_ = verbs::VerbsTransport::prepare(reinterpret_cast<sockaddr*>(&local), cfg.ring_size, &err);
    }
    if (c->verbs_) offer |= wire::kTransportVerbs;
    else RDMASHIM_DEBUG("fd %d: no verbs transport to offer: %s", fd, strerror(-err));
  }
  if (offer & wire::kTransportShm) c->rendezvous_fd_ = shm::open_rendezvous(c->rendezvous_);
  if (!c->rendezvous_fd_) offer &= ~wire::kTransportShm;
  struct {
    wire::Hello hello;
    wire::ParamsFrame params;
  } msg{};
  if (offer == 0 || !random_bytes(c->nonce_, sizeof c->nonce_)) {
    stats::count(stats::Outcome::kTcpSetupFailed);
    RDMASHIM_INFO("fd %d (client) -> %s", fd, stats::name(stats::Outcome::kTcpSetupFailed));
    delete c;
    return nullptr;
  }
  wire::Hello& hello = msg.hello;
  memcpy(hello.magic, wire::kHelloMagic, sizeof hello.magic);
  hello.version = wire::kVersion;
  hello.transports = offer;
  memcpy(hello.nonce, c->nonce_, sizeof hello.nonce);
  memcpy(hello.rendezvous, c->rendezvous_, sizeof hello.rendezvous);
  size_t len = sizeof hello;
  if (offer & wire::kTransportVerbs) {
    msg.params.header = {wire::kParamsBytes, static_cast<uint16_t>(wire::FrameType::kParams), 0};
    memcpy(msg.params.params, &c->verbs_->local_params(), wire::kParamsBytes);
    len += sizeof msg.params;
  }
  static_assert(sizeof msg == wire::kMaxHandshakeMessage);
  // A fresh connection's send buffer is empty: the message goes out whole or
  // not at all. Not at all means we stay plain having sent nothing.
  ssize_t n = sys::real().send(fd, &msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0 && n < static_cast<ssize_t>(len)) {
    n = send_all(fd, reinterpret_cast<char*>(&msg) + n, len - n) == 0 ? static_cast<ssize_t>(len) : -1;
  }
  if (n != static_cast<ssize_t>(len)) {
    stats::count(stats::Outcome::kTcpSetupFailed);
    delete c;
    return nullptr;
  }
  return c;
}

Connection* Connection::make_server(int fd) { return new (std::nothrow) Connection(fd, Role::kServer); }

const char* Connection::transport_name() const { return stats::name(outcome_); }

void Connection::settle(stats::Outcome o) {
  if (settled_) return;
  settled_ = true;
  outcome_ = o;
  stats::count(o);
  RDMASHIM_INFO("fd %d (%s) -> %s", fd(), role_ == Role::kClient ? "client" : "server", stats::name(o));
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
    passthrough_.store(true, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------------------
// Handshake

// Looks for an rdmashim message (a Hello or an Ack) at the head of the
// incoming stream without consuming anything. `extent` says from its first
// 64 bytes how long the whole message is (a Params frame may follow).
//   1: a whole message starting with `magic` is there, copied to out
//   0: the stream starts with something else (application bytes, or EOF)
//  <0: undecided yet (-EAGAIN, -EINTR, ... exactly what the app's read would see)
int Connection::peek_message(const unsigned char (&magic)[8], size_t (*extent)(const unsigned char*),
                             unsigned char (&out)[wire::kMaxHandshakeMessage], size_t* len, int flags,
                             bool may_wait) {
  unsigned char buf[wire::kMaxHandshakeMessage];
  uint64_t give_up = 0;
  for (;;) {
    // The first byte is waited for the way the application's read waits.
    int peek_flags = MSG_PEEK | (may_wait ? (flags & MSG_DONTWAIT) : MSG_DONTWAIT);
    ssize_t n = sys::real().recv(fd_, buf, sizeof buf, peek_flags);
    if (n < 0) return -errno;
    if (n == 0) return 0;
    wire::Match m = wire::match_magic(magic, buf, static_cast<size_t>(n));
    if (m == wire::Match::kNo) return 0;
    if (m == wire::Match::kYes && n >= 64 && static_cast<size_t>(n) >= extent(buf)) {
      *len = extent(buf);
      memcpy(out, buf, *len);
      return 1;
    }
    // A prefix of our message. From an rdmashim peer the rest is already on
    // its way; a plain peer that happened to send these bytes is given the
    // setup timeout, then its bytes are its own.
    if (!may_wait || nonblocking(flags)) return -EAGAIN;
    uint64_t now = now_ns();
    if (!give_up) give_up = now + uint64_t{config().setup_timeout_ms} * 1'000'000;
    if (now >= give_up) return 0;
    usleep(100);
  }
}

namespace {
size_t hello_extent(const unsigned char* m) {
  wire::Hello h;
  memcpy(&h, m, sizeof h);
  return sizeof h + ((h.transports & wire::kTransportVerbs) ? sizeof(wire::ParamsFrame) : 0);
}
size_t ack_extent(const unsigned char* m) {
  wire::Ack a;
  memcpy(&a, m, sizeof a);
  return sizeof a + (a.transport == wire::kTransportVerbs ? sizeof(wire::ParamsFrame) : 0);
}
// The Params after a Hello or Ack, if the message has a valid one.
bool params_of(const unsigned char* msg, size_t len, verbs::Params* out) {
  if (len != 64 + sizeof(wire::ParamsFrame)) return false;
  wire::ParamsFrame f;
  memcpy(&f, msg + 64, sizeof f);
  if (!wire::valid_params_frame(f)) return false;
  memcpy(out, f.params, sizeof *out);
  return true;
}
}  // namespace

int Connection::detect_hello(int flags, bool may_wait) {
  unsigned char msg[wire::kMaxHandshakeMessage];
  size_t len = 0;
  int r = peek_message(wire::kHelloMagic, hello_extent, msg, &len, flags, may_wait);
  if (r < 0) return r;
  auto tx = lock_tx_for_handler();
  in_setup_.store(false, std::memory_order_relaxed);
  if (r == 0) {  // a plain client: everything stays as it is
    rx_ = Rx::kRaw;
    if (tx_ == Tx::kUndecided) tx_ = Tx::kRaw;
    settle(stats::Outcome::kTcpPeerPlain);
    update_passthrough();
    return 0;
  }
  ssize_t n = sys::real().recv(fd_, msg, len, MSG_DONTWAIT);  // consume; it is all there
  if (n != static_cast<ssize_t>(len)) return n < 0 ? -errno : -EIO;
  wire::Hello hello;
  memcpy(&hello, msg, sizeof hello);
  verbs::Params params{};
  bool has_params = params_of(msg, len, &params);
  handle_hello(hello, has_params ? &params : nullptr);
  return 0;
}

// Both locks held. The client frames everything after its Hello.
void Connection::handle_hello(const wire::Hello& hello, const verbs::Params* params) {
  rx_ = Rx::kFramed;
  if (tx_ != Tx::kUndecided) return;  // we spoke first: no Ack; the client will send Plain

  struct {
    wire::Ack ack;
    wire::ParamsFrame params;
  } msg{};
  wire::Ack& ack = msg.ack;
  size_t len = sizeof ack;
  memcpy(ack.magic, wire::kAckMagic, sizeof ack.magic);
  ack.version = wire::kVersion;
  memcpy(ack.nonce, hello.nonce, sizeof ack.nonce);
  stats::Outcome failure = stats::Outcome::kTcpPolicy;
  const Config& cfg = config();
  bool allowed = upgrades_allowed() && cfg.transport != TransportChoice::kTcp;
  // Verbs when the client offers it and shared memory is not the better
  // choice (a peer on another host offers only verbs).
  bool want_verbs = allowed && params && (hello.transports & wire::kTransportVerbs) &&
                    cfg.transport != TransportChoice::kShm &&
                    (cfg.transport == TransportChoice::kVerbs || !(hello.transports & wire::kTransportShm));
  if (want_verbs) {
    int err = -EPROTO;
    sockaddr_storage local{};
    socklen_t llen = sizeof local;
    std::unique_ptr<verbs::VerbsTransport> t;
    if (valid_ring_size(params->ring_size) &&
        sys::real().getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &llen) == 0) {
      t = verbs::VerbsTransport::prepare(reinterpret_cast<sockaddr*>(&local), params->ring_size, &err);
    }
    if (t && (err = t->connect(*params)) == 0) {
      ack.transport = wire::kTransportVerbs;
      ack.ring_size = params->ring_size;
      msg.params.header = {wire::kParamsBytes, static_cast<uint16_t>(wire::FrameType::kParams), 0};
      memcpy(msg.params.params, &t->local_params(), wire::kParamsBytes);
      len += sizeof msg.params;
      adopt(std::move(t));
    } else {
      failure = stats::Outcome::kTcpSetupFailed;
      RDMASHIM_DEBUG("fd %d: verbs setup failed: %s", fd(), strerror(-err));
    }
  }
  if (!transport_ && allowed && (hello.transports & wire::kTransportShm) && cfg.transport != TransportChoice::kVerbs &&
      random_bytes(ack.token, sizeof ack.token)) {
    int err = 0;
    auto t = shm::ShmTransport::offer(cfg.ring_size, hello.rendezvous, ack.token, &err);
    if (t) {
      ack.transport = wire::kTransportShm;
      ack.ring_size = static_cast<uint32_t>(cfg.ring_size);
      adopt(std::move(t));
    } else {
      failure = stats::Outcome::kTcpSetupFailed;
      RDMASHIM_DEBUG("fd %d: shared-memory setup failed: %s", fd(), strerror(-err));
    }
  }
  if (send_all(fd_, &msg, len) != 0) {
    // The client is gone or wedged; nothing more of ours goes out.
    tx_ = Tx::kRaw;
    update_passthrough();
    settle(stats::Outcome::kTcpSetupFailed);
    return;
  }
  if (transport_) {
    tx_ = Tx::kFramed;  // until the client has attached; see advance_tx()
    settle(ack.transport == wire::kTransportVerbs ? stats::Outcome::kVerbs : stats::Outcome::kShm);
  } else {
    tx_ = Tx::kRaw;  // a negative Ack is followed by raw bytes
    settle(failure);
  }
}

int Connection::await_ack(int flags, bool may_wait) {
  unsigned char msg[wire::kMaxHandshakeMessage];
  size_t len = 0;
  int r = peek_message(wire::kAckMagic, ack_extent, msg, &len, flags, may_wait);
  if (r < 0) return r;
  auto tx = lock_tx_for_handler();
  in_setup_.store(false, std::memory_order_relaxed);
  wire::Ack ack;
  memcpy(&ack, msg, sizeof ack);
  if (r == 1 && memcmp(ack.nonce, nonce_, sizeof nonce_) == 0) {
    ssize_t n = sys::real().recv(fd_, msg, len, MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(len)) return n < 0 ? -errno : -EIO;
    verbs::Params params{};
    bool has_params = params_of(msg, len, &params);
    handle_ack(ack, has_params ? &params : nullptr);
    return 0;
  }
  // The server's application spoke before our Hello reached it: its bytes
  // are the application's, it will strip our Hello, we go plain.
  rx_ = Rx::kRaw;
  rendezvous_fd_.reset();
  verbs_.reset();
  tx_go_plain();
  settle(stats::Outcome::kTcpServerSpokeFirst);
  update_passthrough();
  return 0;
}

// Both locks held.
void Connection::handle_ack(const wire::Ack& ack, const verbs::Params* params) {
  rx_ = Rx::kFramed;
  int err = -EPROTO;
  stats::Outcome ok = stats::Outcome::kShm;
  if (ack.version == wire::kVersion && ack.transport == wire::kTransportShm && valid_ring_size(ack.ring_size)) {
    auto t = shm::ShmTransport::accept(rendezvous_fd_.get(), ack.token, ack.ring_size, &err);
    if (t) adopt(std::move(t));
  } else if (ack.version == wire::kVersion && ack.transport == wire::kTransportVerbs && params && verbs_ &&
             ack.ring_size == verbs_->local_params().ring_size) {
    // The server's QP is already connected to ours: once ours is, we may write.
    if ((err = verbs_->connect(*params)) == 0) adopt(std::move(verbs_));
    ok = stats::Outcome::kVerbs;
  }
  rendezvous_fd_.reset();
  verbs_.reset();
  if (!transport_) {
    if (ack.transport == 0) rx_ = Rx::kRaw;  // a negative Ack is followed by raw bytes
    if (ack.transport != 0) RDMASHIM_DEBUG("fd %d: attaching the transport failed: %s", fd(), strerror(-err));
    tx_go_plain();
    settle(ack.transport == 0 ? stats::Outcome::kTcpPolicy : stats::Outcome::kTcpSetupFailed);
    update_passthrough();
    return;
  }
  transport_->mark_attached();
  tx_go_ring();
  settle(ok);
}

// Both locks held.
void Connection::adopt(std::unique_ptr<Transport> t) {
  ring_.reset(new (std::nothrow) RingChannel(t->link()));
  if (!ring_) return;
  transport_ = std::move(t);
  std::lock_guard<std::mutex> lock(wake_mu_);
  wake_fd_ = transport_->link().wait_fd();
}

// Both locks held: the peer said Plain, so its direction is raw from now on
// and ours follows as soon as we are at a frame boundary.
void Connection::on_peer_plain() {
  rx_ = Rx::kRaw;
  if (tx_ == Tx::kFramed) tx_go_plain();
  if (!settled_) settle(stats::Outcome::kTcpSetupFailed);
  update_passthrough();
}

int Connection::finish_setup(int timeout_ms) {
  uint64_t give_up = now_ns() + static_cast<uint64_t>(timeout_ms) * 1'000'000;
  std::lock_guard<std::mutex> rx(rx_mu_);
  std::lock_guard<std::mutex> tx(tx_mu_);
  tx_held_ = true;
  int r = 0;
  while (rx_ == Rx::kAwaitAck || rx_ == Rx::kDetectHello) {
    r = rx_ == Rx::kAwaitAck ? await_ack(MSG_DONTWAIT, true) : detect_hello(MSG_DONTWAIT, true);
    if (r == 0) continue;
    uint64_t now = now_ns();
    if (r != -EAGAIN && r != -EINTR) break;
    if (now >= give_up) {
      r = -ETIMEDOUT;
      break;
    }
    pollfd p{fd_, POLLIN, 0};
    sys::real().poll(&p, 1, static_cast<int>((give_up - now) / 1'000'000) + 1);
  }
  // A server switches its own direction once the client has attached.
  while (r == 0 && role_ == Role::kServer && tx_ == Tx::kFramed && transport_ && !transport_->peer_attached()) {
    if (now_ns() >= give_up) {
      r = -ETIMEDOUT;
      break;
    }
    usleep(20);
  }
  if (r == 0) advance_tx();
  tx_held_ = false;
  return r;
}

// ---------------------------------------------------------------------------
// Receiving

ssize_t Connection::recv(const iovec* iov, int iovcnt, int flags) {
  io_started_.store(true, std::memory_order_relaxed);
  if (orphaned_) return -ECONNRESET;
  std::lock_guard<std::mutex> lock(rx_mu_);
  follow_sibling_switch_rx();
  if (rx_ == Rx::kRaw) return tcp_recv(fd_, iov, iovcnt, flags);
  if (flags & MSG_OOB) return rx_ == Rx::kRing ? recv_urgent(iov, iovcnt, flags) : -EINVAL;
  size_t want = iov_total(iov, iovcnt);
  if (want == 0) {
    // TCP waits (once) for data even for zero bytes: read(2)'s shortcut is in the hooks.
    if (rx_ == Rx::kRing) return recv_ring_empty(flags);
    return tcp_recv(fd_, iov, iovcnt, flags & ~MSG_WAITALL);
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
        return tcp_recv(fd_, iov, iovcnt, flags);
      case Rx::kDetectHello:
        r = detect_hello(flags, true);
        break;
      case Rx::kAwaitAck:
        r = await_ack(flags, true);
        break;
      case Rx::kFramed:
        if (rx_frame_left_ > 0) {
          iovec part[kMaxIov];
          int n = iov_slice(iov, iovcnt, 0, rx_frame_left_, part, kMaxIov);
          ssize_t got = tcp_recv(fd_, part, n, flags);
          if (got > 0 && !(flags & MSG_PEEK)) rx_frame_left_ -= static_cast<uint32_t>(got);
          return got;
        }
        follow_sibling_switch_rx();
        if (rx_ == Rx::kRing) continue;
        r = read_frame(flags);
        if (r == 0) return 0;  // EOF at a frame boundary
        if (r > 0) r = 0;
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
    ssize_t n = sys::real().recv(fd_, reinterpret_cast<char*>(&rx_hdr_) + rx_hdr_have_,
                                 sizeof rx_hdr_ - rx_hdr_have_, flags & MSG_DONTWAIT);
    if (n == 0) return 0;
    if (n < 0) return -errno;
    rx_hdr_have_ += static_cast<uint32_t>(n);
  }
  if (!wire::valid(rx_hdr_)) return -EPROTO;
  bool is_data = rx_hdr_.type == static_cast<uint16_t>(wire::FrameType::kData);
  while (!is_data && rx_ctl_have_ < rx_hdr_.length) {
    ssize_t n = sys::real().recv(fd_, rx_ctl_ + rx_ctl_have_, rx_hdr_.length - rx_ctl_have_, flags & MSG_DONTWAIT);
    if (n == 0) return 0;
    if (n < 0) return -errno;
    rx_ctl_have_ += static_cast<uint32_t>(n);
  }
  return 1;
}

// Framed mode: one frame. Returns 1 after acting on it, 0 on EOF, <0 -errno.
int Connection::read_frame(int flags) {
  int r = read_frame_bytes(flags);
  if (r == -EPROTO) return broken("malformed frame header");
  if (r <= 0) return r;
  wire::FrameHeader h = rx_hdr_;
  rx_hdr_have_ = 0;
  rx_ctl_have_ = 0;
  switch (static_cast<wire::FrameType>(h.type)) {
    case wire::FrameType::kData:
      rx_frame_left_ = h.length;
      return 1;
    case wire::FrameType::kSwitch:
      if (!ring_) return broken("switch without a transport");
      transport_->mark_switched(Transport::Dir::kRx);
      rx_ = Rx::kRing;
      rx_ring_.store(true, std::memory_order_release);
      return 1;
    case wire::FrameType::kPlain: {
      auto tx = lock_tx_for_handler();
      on_peer_plain();
      return 1;
    }
    case wire::FrameType::kParams:  // only ever right after a Hello or an Ack
      return broken("stray params frame");
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
  for (;;) {
    int r = read_frame_bytes(MSG_DONTWAIT);
    if (r == -EAGAIN || r == -EWOULDBLOCK || r == -EINTR) return changed;
    if (r == 0) {
      // FIN: the peer will not write again. Whether it still reads is for
      // the writer to find out (see wait_ring).
      tcp_eof_ = true;
      tcp_done_.store(true, std::memory_order_relaxed);
      peer_wr_shut_.store(true, std::memory_order_relaxed);
      rx_end_.store(true, std::memory_order_release);
      return true;
    }
    if (r < 0) {
      if (r == -EPROTO) {
        broken("malformed control frame");
      } else {
        tcp_error_ = -r;
        tcp_done_.store(true, std::memory_order_relaxed);
        peer_gone_.store(true, std::memory_order_relaxed);
        rx_end_.store(true, std::memory_order_release);
      }
      return true;
    }
    wire::FrameHeader h = rx_hdr_;
    rx_hdr_have_ = 0;
    rx_ctl_have_ = 0;
    if (h.type == static_cast<uint16_t>(wire::FrameType::kClose)) {
      memcpy(&peer_final_, rx_ctl_, sizeof peer_final_);
      peer_closed_ = true;
      peer_wr_shut_.store(true, std::memory_order_relaxed);
      rx_end_.store(true, std::memory_order_release);
    } else if (h.type == static_cast<uint16_t>(wire::FrameType::kUrgent)) {
      wire::Urgent u;
      memcpy(&u, rx_ctl_, sizeof u);
      urg_pos_ = u.position;
      urg_byte_ = u.byte;
      urg_state_.store(kUrgValid, std::memory_order_release);
    } else if (h.type != static_cast<uint16_t>(wire::FrameType::kPing)) {
      broken("data frame after switch");
      return true;
    }
    changed = true;
  }
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
          !nonblocking(flags)) {
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
    if (r > 0 || r == -EFAULT) return r;
    if (r < 0) return broken("ring cursor out of bounds");
    if (rx_shut_.load(std::memory_order_relaxed)) return 0;
    if (peer_closed_ && ring_->rx_position() >= peer_final_) return 0;
    if (tcp_error_ != 0) {
      // Like the kernel: the error once, then end of stream.
      int e = std::exchange(tcp_error_, 0);
      tcp_eof_ = true;
      return -e;
    }
    if (tcp_eof_) return 0;
    if (nonblocking(flags)) {
      if (poll_control()) continue;
      return -EAGAIN;
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
    if (ring_->readable() != 0 || rx_end_.load(std::memory_order_acquire)) return 0;
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
  // A ring smaller than twice the mark could never wake the reader.
  size_t half = ring_->link().ring_size() / 2;
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

ssize_t Connection::send(const iovec* iov, int iovcnt, int flags) {
  // During the handshake a send may settle what the receive side is waiting
  // for (a Hello or an Ack already queued); it takes the receive lock only if
  // free, since a reader that holds it settles the same thing itself.
  io_started_.store(true, std::memory_order_relaxed);
  if (orphaned_) return -ECONNRESET;
  std::unique_lock<std::mutex> rx(rx_mu_, std::defer_lock);
  if (in_setup_.load(std::memory_order_relaxed)) (void)rx.try_lock();
  std::lock_guard<std::mutex> tx(tx_mu_);
  follow_sibling_switch_tx();
  if (rx.owns_lock()) {
    tx_held_ = true;
    if (rx_ == Rx::kDetectHello && tx_ == Tx::kUndecided) {
      // Give a Hello that is on its way a moment to land before we speak.
      uint64_t now = now_ns();
      if (now < created_ns_ + kHelloGraceNs) {
        pollfd p{fd_, POLLIN, 0};
        sys::real().poll(&p, 1, static_cast<int>((created_ns_ + kHelloGraceNs - now) / 1'000'000) + 1);
      }
      (void)detect_hello(MSG_DONTWAIT, false);
    } else if (rx_ == Rx::kAwaitAck) {
      (void)await_ack(MSG_DONTWAIT, false);
    }
    tx_held_ = false;
    rx.unlock();
  }
  if (tx_ == Tx::kUndecided) {
    // Our application speaks first and no Hello is here: its bytes go out as
    // they are. A Hello arriving later is stripped; the client goes plain.
    tx_ = Tx::kRaw;
    settle(stats::Outcome::kTcpServerSpokeFirst);
  }
  if (tx_shut_.load(std::memory_order_relaxed) && tx_ == Tx::kRing) return epipe(flags);
  if (tx_ == Tx::kFramed) {
    advance_tx();
    if (tx_ == Tx::kRaw && (rx.owns_lock() || rx.try_lock())) update_passthrough();
  }
  switch (tx_) {
    case Tx::kRing:
      return (flags & MSG_OOB) ? send_ring_urgent(iov, iovcnt, flags) : send_ring(iov, iovcnt, flags);
    case Tx::kFramed:
      return send_framed(iov, iovcnt, flags);
    default:
      return tcp_send(fd_, iov, iovcnt, flags);
  }
}

// Applies a pending switch (to the ring or to plain) at a frame boundary.
void Connection::advance_tx() {
  if (tx_ != Tx::kFramed || tx_hdr_left_ != 0 || tx_frame_left_ != 0) return;
  if (tx_want_ == TxWant::kNone && role_ == Role::kServer && transport_ && transport_->peer_attached()) {
    tx_want_ = TxWant::kRing;
  }
  if (tx_want_ == TxWant::kNone) return;
  wire::FrameType type = tx_want_ == TxWant::kRing ? wire::FrameType::kSwitch : wire::FrameType::kPlain;
  if (send_control(type, nullptr, 0) != 0) return;  // try again at the next send
  tx_ = tx_want_ == TxWant::kRing ? Tx::kRing : Tx::kRaw;
  if (tx_ == Tx::kRing) {
    transport_->mark_switched(Transport::Dir::kTx);
    tx_ring_.store(true, std::memory_order_release);
  }
  tx_want_ = TxWant::kNone;
}

// The Switch (or Plain) frame goes out with our next send, not now: the peer
// may already have answered and closed, and a frame landing on a closed
// socket makes its kernel reset the connection, discarding the answer we
// have yet to read (an HTTP/1.0-style server). Until then our direction
// stays framed, which the peer reads as it would anyway.
void Connection::tx_go_plain() {
  if (tx_ == Tx::kFramed) tx_want_ = TxWant::kPlain;
}

void Connection::tx_go_ring() {
  if (tx_ == Tx::kFramed) tx_want_ = TxWant::kRing;
}

int Connection::send_control(wire::FrameType type, const void* payload, uint32_t len) {
  unsigned char buf[sizeof(wire::FrameHeader) + wire::kMaxControlPayload];
  wire::FrameHeader h{len, static_cast<uint16_t>(type), 0};
  memcpy(buf, &h, sizeof h);
  if (len) memcpy(buf + sizeof h, payload, len);
  // Not a single byte yet: the caller may retry later. Once the first byte
  // left, the frame must be completed.
  ssize_t n = sys::real().send(fd_, buf, sizeof h + len, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0) return -errno;
  if (static_cast<size_t>(n) == sizeof h + len) return 0;
  return send_all(fd_, buf + n, sizeof h + len - static_cast<size_t>(n));
}

ssize_t Connection::send_framed(const iovec* iov, int iovcnt, int flags) {
  size_t total = iov_total(iov, iovcnt);
  if (total == 0) return tcp_send(fd_, iov, iovcnt, flags);
  int sflags = flags & (MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE);
  size_t done = 0;
  while (done < total) {
    if (tx_hdr_left_ == 0 && tx_frame_left_ == 0) {
      advance_tx();
      if (tx_ != Tx::kFramed) {
        if (done > 0) return static_cast<ssize_t>(done);
        return tx_ == Tx::kRing ? send_ring(iov, iovcnt, flags) : tcp_send(fd_, iov, iovcnt, flags);
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
    ssize_t r = tcp_send(fd_, parts, n, sflags);
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
    ssize_t r = ring_->write(iov, iovcnt, done);
    if (r == -EFAULT) return done > 0 ? static_cast<ssize_t>(done) : r;
    if (r < 0) return broken("ring cursor out of bounds");
    done += static_cast<size_t>(r);
    if (done == total) return static_cast<ssize_t>(done);
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

int Connection::shutdown(int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
  if (how != SHUT_RD) {
    // Wake a writer of ours blocked on a full ring, then tell the peer where
    // our stream ends before the FIN.
    tx_shut_.store(true, std::memory_order_relaxed);
    wake_self();
    std::lock_guard<std::mutex> tx(tx_mu_);
    if (tx_ == Tx::kRing) {
      flush_tx();  // the Close frame and the FIN must not overtake the data
      uint64_t pos = ring_->tx_position();
      if (!close_sent_) close_sent_ = send_control(wire::FrameType::kClose, &pos, sizeof pos) == 0;
    } else if (tx_ == Tx::kUndecided) {
      tx_ = Tx::kRaw;
    }
  }
  if (how != SHUT_WR) {
    rx_shut_.store(true, std::memory_order_relaxed);
    rx_end_.store(true, std::memory_order_release);
    wake_self();
  }
  if (rx_shut_.load() && tx_shut_.load() && rx_ring_.load(std::memory_order_acquire) &&
      shut_tail_.load(std::memory_order_relaxed) == UINT64_MAX) {
    shut_tail_.store(ring_->link().peer_tail(), std::memory_order_release);
  }
  int r = sys::real().shutdown(fd_, how);
  return r == 0 ? 0 : -errno;
}

// ---------------------------------------------------------------------------
// Waiting and errors

void Connection::wake_self() {
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t ignored = sys::real().write(wake_fd_, &one, sizeof one);
    (void)ignored;
  }
}

// O_NONBLOCK and the timeouts are asked of the kernel once and kept until the
// preload sees them change: two system calls less on every wait.
bool Connection::cacheable() const { return transport_ && !transport_->shared(); }

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

// Spins for RDMASHIM_SPIN_US, then sleeps on the doorbell and the TCP socket
// (which reports the peer's control frames, FIN and RST). Returns 0 when
// something may have changed, -EAGAIN at the deadline, -EINTR on a signal
// the kernel would not have restarted.
int Connection::wait_ring(bool for_write, int64_t dl, size_t min_bytes) {
  auto ready = [&] {
    if (for_write) return ring_->writable() != 0;
    ssize_t n = ring_->readable();
    return n < 0 || static_cast<size_t>(n) >= min_bytes || (min_bytes > 1 && rx_end_.load(std::memory_order_acquire));
  };
  Link& link = transport_->link();
  const uint32_t yield_mask = link.spin_yield_mask();
  uint64_t spin_end = now_ns() + uint64_t{spin_budget_us()} * 1000;
  for (uint32_t i = 1;; ++i) {
    if (ready()) return 0;
    if ((i & yield_mask) == 0) sched_yield();  // let a runnable peer (or provider) on our core go first
    if ((i & 63) == 0 && now_ns() >= spin_end) break;
    cpu_relax();
  }
  link.prepare_sleep();
  if (ready() || (for_write ? tx_shut_ : rx_shut_).load(std::memory_order_relaxed)) {
    link.finish_sleep();
    return 0;
  }
  // A reader also waits for the TCP side to speak (control frames, FIN, RST).
  // A writer only listens for errors there: a full ring to a peer whose
  // socket is gone would never drain, so it pings now and then, and a gone
  // peer's kernel answers with RST, which poll reports as POLLERR.
  if (for_write) ping_if_due();
  short tcp_events = !for_write && !tcp_done_.load(std::memory_order_relaxed) ? POLLIN : 0;
  pollfd p[2] = {{link.wait_fd(), POLLIN, 0}, {fd(), tcp_events, 0}};
  int timeout = -1;
  if (dl != kNoDeadline) {
    int64_t left = dl - static_cast<int64_t>(now_ns());
    timeout = left <= 0 ? 0 : static_cast<int>((left + 999'999) / 1'000'000);
  }
  if (for_write && (timeout < 0 || timeout > kPingIntervalMs)) timeout = kPingIntervalMs;
  int r = sys::real().poll(p, 2, timeout);
  int e = errno;
  link.finish_sleep();
  if (r < 0) {
    if (e != EINTR) return -e;
    return dl == kNoDeadline && signals_restart() ? 0 : -EINTR;
  }
  if (r == 0 && dl != kNoDeadline && static_cast<int64_t>(now_ns()) >= dl) return -EAGAIN;
  if (for_write) {
    if (p[1].revents & POLLERR) peer_gone_.store(true, std::memory_order_relaxed);
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
  if ((kernel & POLLIN) && !rx_ring_.load(std::memory_order_acquire) && !passthrough()) {
    kernel = consume_setup_bytes(kernel);
  }
  short ev = kernel & (POLLERR | POLLHUP | POLLNVAL);
  if (!rx_ring_.load(std::memory_order_acquire)) {
    ev |= kernel & (POLLIN | POLLRDNORM | POLLRDBAND | POLLPRI | POLLRDHUP);
  } else {
    // After the switch the TCP side carries only our control frames: it is
    // readable for the application only if it ended (FIN, RST, Close).
    if ((kernel & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) && !rx_end_.load(std::memory_order_acquire)) {
      std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
      if (rx.owns_lock()) poll_control();
    }
    if (shut_tail_.load(std::memory_order_relaxed) != UINT64_MAX) abort_if_data_after_shutdown();
    size_t lowat = rcvlowat();
    bool data = lowat <= 1 ? ring_->readable_hint() : ring_->unread_hint() >= lowat;
    if (data || rx_end_.load(std::memory_order_acquire)) ev |= POLLIN | POLLRDNORM;
    if (peer_wr_shut_.load(std::memory_order_relaxed) || rx_shut_.load(std::memory_order_relaxed)) ev |= POLLRDHUP;
    if (urg_state_.load(std::memory_order_relaxed) == kUrgValid) ev |= POLLPRI;
  }
  if (!tx_ring_.load(std::memory_order_acquire)) {
    ev |= kernel & (POLLOUT | POLLWRNORM | POLLWRBAND);
  } else if (ring_->writable_hint() || peer_gone_.load(std::memory_order_relaxed) ||
             tx_shut_.load(std::memory_order_relaxed)) {
    ev |= POLLOUT | POLLWRNORM;  // after SHUT_WR the kernel too says writable (the write fails)
  }
  return static_cast<short>(ev & (want | POLLERR | POLLHUP | POLLNVAL));
}

// Before the ring, the bytes that make the TCP socket readable may all be
// ours (a Hello, an Ack, a frame header, a Switch). The kernel never wakes a
// reader for nothing, so neither may we: consume what is ours, never the
// application's bytes, and report POLLIN only if its read will find some.
// Never blocks: if another thread holds a lock, it is settling this itself.
short Connection::consume_setup_bytes(short kernel) {
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock()) return kernel;
  std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);
  if (!tx.owns_lock()) return kernel;
  tx_held_ = true;
  bool consumed = false, readable = true;
  for (int turn = 0; turn < 16; ++turn) {
    int r;
    if (rx_ == Rx::kDetectHello) {
      r = detect_hello(MSG_DONTWAIT, false);
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
    sys::real().poll(&p, 1, 0);
    kernel = static_cast<short>((kernel & ~kIn) | (p.revents & kIn));
  }
  return kernel;
}

short Connection::kernel_interest(short want) const {
  short k = 0;
  if (!rx_ring_.load(std::memory_order_acquire)) {
    k |= want & (POLLIN | POLLRDNORM | POLLPRI | POLLRDHUP);
  } else if (!rx_end_.load(std::memory_order_acquire)) {
    k |= POLLIN;  // control frames, FIN, RST; after the end it would stay readable forever
  }
  if (!tx_ring_.load(std::memory_order_acquire)) k |= want & (POLLOUT | POLLWRNORM | POLLWRBAND);
  return k;
}

int Connection::doorbell() {
  std::lock_guard<std::mutex> lock(wake_mu_);
  return wake_fd_;
}

// Only called while on_ring(): the transport then lives as long as we do.
void Connection::arm() { transport_->link().prepare_sleep(); }
void Connection::disarm() { transport_->link().finish_sleep(); }

uint64_t Connection::rx_progress() const {
  if (!rx_ring_.load(std::memory_order_acquire)) return 0;
  return ring_->link().peer_tail() + (rx_end_.load(std::memory_order_relaxed) ? (uint64_t{1} << 63) : 0);
}

// Bit 63 marks "on the ring", so a caller can tell the switch itself from
// a write that found the ring full.
uint64_t Connection::tx_progress() const {
  return tx_ring_.load(std::memory_order_acquire) ? tx_full_.load(std::memory_order_relaxed) | (uint64_t{1} << 63)
                                                  : 0;
}

int64_t Connection::unread_bytes() {
  if (!rx_ring_.load(std::memory_order_acquire)) return -1;
  if (shut_tail_.load(std::memory_order_relaxed) != UINT64_MAX && abort_if_data_after_shutdown()) {
    uint64_t pos = ring_->link().own_head(), end = shut_tail_.load(std::memory_order_acquire);
    return pos < end ? static_cast<int64_t>(end - pos) : 0;
  }
  return static_cast<int64_t>(ring_->unread_hint());
}

int64_t Connection::unsent_bytes() const {
  return tx_ring_.load(std::memory_order_acquire) ? static_cast<int64_t>(ring_->unacked_hint()) : -1;
}

int Connection::epipe(int flags) {
  if (!(flags & MSG_NOSIGNAL)) {
    // What the kernel does on a write to a closed stream.
    pthread_kill(pthread_self(), SIGPIPE);
  }
  return -EPIPE;
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
