// The handshake: the client's Hello (with its Params), the server's answer
// (Ack, Params), adopting the transport either side ends up with, falling
// back to plain TCP, and switching each direction onto the ring (or to
// plain) at a frame boundary.
#include "conn/connection.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "conn/connection_internal.h"
#include "discovery/announcements.h"
#include "discovery/registry.h"
#include "discovery/sockdiag.h"
#include "shm/shm_transport.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/fault.h"
#include "util/fd_budget.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/process.h"
#include "util/schedule.h"
#include "util/user_copy.h"
#include "verbs/policy.h"
#include "verbs/verbs_transport.h"

namespace rdmashim {

using conn_internal::send_all;

namespace {
bool peer_is_local(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  return sys::real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 &&
         discovery::is_local_address(reinterpret_cast<sockaddr*>(&peer), len);
}
}  // namespace

std::unique_ptr<Connection> Connection::make_client(int fd, discovery::Announcement announce, const uint8_t* nonce) {
  if (!upgrades_allowed()) {
    announce.withdraw(fd);
    stats::count(stats::Outcome::kTcpPolicy);
    RDMASHIM_INFO("fd %d (client) -> %s", fd, stats::name(stats::Outcome::kTcpPolicy));
    return nullptr;
  }
  std::unique_ptr<Connection> c(new (std::nothrow) Connection(fd, Role::kClient));
  if (!c) {
    announce.withdraw(fd);
    return nullptr;
  }
  c->announce_ = std::move(announce);
  // No Hello sent: nothing for a server to wait for, and the program's TTL
  // back now (the connection's destructor runs when the number may be another's).
  struct Unsent {
    Connection* c;
    ~Unsent() {
      if (c) c->announce_.withdraw(c->fd_);
    }
  } unsent{c.get()};
  // Shared memory to a peer on this host, verbs to one elsewhere (or to any
  // when RDMASHIM_TRANSPORT=verbs); both are offered, the server chooses.
  const Config& cfg = config();
  sockaddr_storage local{};
  socklen_t llen = sizeof local;
  bool same_host = peer_is_local(fd);
  uint32_t offer = 0;
  if (same_host && cfg.transport != TransportChoice::kVerbs) offer |= wire::kTransportShm;
  // Across hosts on a software RDMA device TCP is faster: no verbs offered
  // unless asked for (verbs/policy.h).
  const char* refused = nullptr;
  const char* limit = nullptr;  // this process is at its verbs limits: which
  bool budget = false;          // no room for our descriptors
  if ((!same_host || cfg.transport == TransportChoice::kVerbs) && !verbs::remote_refused(&refused)) {
    int err = 0;
    if (sys::real().getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0) {
      // Registered at what TCP would buffer here; the server may answer less.
      c->verbs_ = verbs::VerbsTransport::prepare(reinterpret_cast<sockaddr*>(&local),
                                                 verbs::VerbsTransport::ring_size_for(fd), &err, &limit);
    }
    if (c->verbs_) offer |= wire::kTransportVerbs;
    else RDMASHIM_DEBUG("fd %d: no verbs transport to offer: %s", fd, strerror(-err));
    budget = !c->verbs_ && fds::exhausted(err);  // its completion channel's descriptor
  }
  // The nonce a remote server was told of before our SYN, or a fresh one.
  if (nonce) memcpy(c->nonce_, nonce, sizeof c->nonce_);
  bool have_nonce = !RDMASHIM_FAULT(kRandom) && (nonce || random_bytes(c->nonce_, sizeof c->nonce_));
  // The descriptors must later come from the user that owns the server's
  // end of this connection: asked now, while that end surely exists.
  if (have_nonce && (offer & wire::kTransportShm) && discovery::tcp_server_uid(fd, &c->server_uid_)) {
    c->rendezvous_fd_ = shm::open_rendezvous(c->rendezvous_, c->nonce_);
    if (!c->rendezvous_fd_ && fds::exhausted(errno)) budget = true;
    // Room for it and for the segment's three to come.
    // After the Ack come the segment's memfd and our local page.
    if (c->rendezvous_fd_ && !fds::keep(c->rendezvous_fd_, shm::kHandoffFds + 1)) budget = true;
    if (c->rendezvous_fd_) c->segment_fds_ = fds::Promise(shm::kHandoffFds + 1);
  }
  if (!c->rendezvous_fd_) offer &= ~wire::kTransportShm;
  struct {
    wire::Hello hello;
    wire::ParamsFrame params;
  } msg{};
  if (offer == 0 || !have_nonce) {
    auto why = budget                  ? stats::Outcome::kTcpFdBudget
               : limit && offer == 0   ? stats::Outcome::kTcpVerbsLimit
               : refused && offer == 0 ? stats::Outcome::kTcpPolicy
                                       : stats::Outcome::kTcpSetupFailed;
    stats::count(why);
    const char* said = why == stats::Outcome::kTcpPolicy ? refused : why == stats::Outcome::kTcpVerbsLimit ? limit : nullptr;
    if (said) RDMASHIM_INFO("fd %d (client) -> %s (%s)", fd, stats::name(why), said);
    else RDMASHIM_INFO("fd %d (client) -> %s", fd, stats::name(why));
    return nullptr;
  }
  wire::Hello& hello = msg.hello;
  memcpy(hello.magic, wire::kHelloMagic, sizeof hello.magic);
  hello.version = wire::kVersion;
  hello.flags = wire::kHelloFlagDowngrade;  // we read Downgrade frames
  hello.transports = offer;
  int sndbuf = 0;
  socklen_t sndbuf_len = sizeof sndbuf;
  if (sys::real().getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &sndbuf_len) == 0 && sndbuf > 0) {
    hello.sndbuf = static_cast<uint32_t>(sndbuf);
  }
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
  RDMASHIM_SCHED_POINT(kHandshakeSendHello);
  // A server that spoke first (after its grace for a Hello) may already have
  // closed, e.g. a banner and close: a Hello landing on its closed socket
  // makes its kernel reset the connection, and we would lose the banner.
  // Its bytes or FIN already here: stay plain, having sent nothing.
  char first;
  if (sys::real().recv(fd, &first, 1, MSG_PEEK | MSG_DONTWAIT) >= 0) {
    stats::count(stats::Outcome::kTcpServerSpokeFirst);
    RDMASHIM_INFO("fd %d (client) -> %s", fd, stats::name(stats::Outcome::kTcpServerSpokeFirst));
    return nullptr;
  }
  ssize_t n = sys::real().send(fd, &msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0 && n < static_cast<ssize_t>(len)) {
    n = send_all(fd, reinterpret_cast<char*>(&msg) + n, len - n) == 0 ? static_cast<ssize_t>(len) : -1;
  }
  if (n != static_cast<ssize_t>(len)) {
    stats::count(stats::Outcome::kTcpSetupFailed);
    return nullptr;
  }
  unsent.c = nullptr;
  return c;
}

// ---------------------------------------------------------------------------
// Handshake

namespace {
using conn_internal::ack_extent;
using conn_internal::hello_extent;
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

// Rx lock held, at the last close. A side that never read leaves the peer's
// Hello (a server that wrote first) or Ack (a client that only wrote)
// unread; closing a socket with unread bytes makes the kernel reset the
// connection, and the peer loses what it had yet to read. A plain peer's
// close would have found nothing unread: consume ours if it is all there.
// Only where this process did I/O on it: a parent closing the socket it
// handed to a child (fork per connection) must leave the Hello to the child.
void Connection::discard_unread_handshake() {
  unsigned char msg[wire::kMaxHandshakeMessage];
  size_t len = 0;
  bool server = rx_ == Rx::kDetectHello;
  if ((!server && rx_ != Rx::kAwaitAck) || !io_started_.load(std::memory_order_relaxed)) return;
  if (peek_message(server ? wire::kHelloMagic : wire::kAckMagic, server ? hello_extent : ack_extent, msg, &len,
                   MSG_DONTWAIT, false) != 1) {
    return;
  }
  wire::Ack ack;
  memcpy(&ack, msg, sizeof ack);
  if (!server && memcmp(ack.nonce, nonce_, sizeof nonce_) != 0) return;  // application bytes
  sys::real().recv(fd_, msg, len, MSG_DONTWAIT);
}

int Connection::detect_hello(int flags, bool may_wait) {
  unsigned char msg[wire::kMaxHandshakeMessage];
  size_t len = 0;
  int r = peek_message(wire::kHelloMagic, hello_extent, msg, &len, flags, may_wait);
  if (r < 0) return r;
  RDMASHIM_SCHED_POINT(kHandshakeDetectHello);
  auto tx = lock_tx_for_handler();
  in_setup_.store(false, std::memory_order_relaxed);
  end_hold();  // a held first write goes on (onto the ring, or raw)
  if (r == 0) {
    client_is_plain();
    return 0;
  }
  ssize_t n = sys::real().recv(fd_, msg, len, MSG_DONTWAIT);  // consume; it is all there
  if (n != static_cast<ssize_t>(len)) return n < 0 ? -errno : -EIO;
  take_hello(msg, len);
  return 0;
}

// Both locks held. A plain client: everything stays as it is.
void Connection::client_is_plain() {
  rx_ = Rx::kRaw;
  if (tx_ == Tx::kUndecided) tx_ = Tx::kRaw;
  settle(stats::Outcome::kTcpPeerPlain);
  update_passthrough();
}

// Both locks held. A whole Hello (and its Params), taken off the stream.
void Connection::take_hello(const unsigned char* msg, size_t len) {
  wire::Hello hello;
  memcpy(&hello, msg, sizeof hello);
  discovery::remote_hello_arrived(hello.nonce);  // its announcement, if any, is done
  verbs::Params params{};
  bool has_params = params_of(msg, len, &params);
  handle_hello(hello, has_params ? &params : nullptr);
}

// Both locks held; our application is about to write first. A client under
// rdmashim announced itself before its SYN: on this host with an abstract
// name (discovery::client_announced), from another host in its RDMA-CM probe
// (discovery::remote_client_announced). For it we wait until its Hello is
// here, so a server that speaks first upgrades every time. A client that did
// not announce itself is not waited for at all.
// A non-blocking write waits at most kHoldInCallMs: a well-behaved client's
// Hello is microseconds behind its connect, and a program may not expect
// EAGAIN from a fresh socket's first small write (TCP never gives it, nor
// after poll said writable: then the bytes go out raw). Then it gets EAGAIN and the socket reads as not writable (poll_events) until
// the Hello comes, the client's announcement goes or the setup timeout
// passes, as with a full send buffer. So a client that announces a Hello
// and never sends it (a hostile one) holds back its own greeting, and costs
// an event loop at most that millisecond, not the setup timeout.
int Connection::await_hello_before_speaking(int flags) {
  int saved = errno;
  uint64_t until = hold_until_ns_.load(std::memory_order_relaxed);
  bool unmarked = false;
  if (until == 0 && syn_kept_) {
    syn_kept_ = false;
    unmarked = discovery::read_syn(fd_) == discovery::SynSays::kUnmarked;
    // No client on this host announced this connection (syn_mark.h): unless
    // one on another host did, the bytes go now, without even a look for a
    // Hello (one that came all the same is stripped as a late one).
    if (unmarked && !discovery::remote_client_announced(fd_)) {
      errno = saved;
      hold_until_ns_.store(kHoldOver, std::memory_order_relaxed);
      return 0;
    }
  }
  if (detect_hello(MSG_DONTWAIT, false) != -EAGAIN || rx_ != Rx::kDetectHello) return 0;
  if (until == kHoldOver) return 0;  // held once already: the bytes go out raw
  bool local = hold_local_.load(std::memory_order_relaxed);
  if (until == 0) {
    bool announced = unmarked;  // then by another host (above)
    local = false;
    if (!unmarked) {
      announced = discovery::client_announced(fd_, &local);
      if (!local) announced = discovery::remote_client_announced(fd_);
    }
    errno = saved;
    if (!announced) return 0;
  }
  const bool nonblock = nonblocking(flags);  // asked only now: most clients are plain
  if (until == 0) {
    const uint64_t now = now_ns();
    until = now + uint64_t{config().setup_timeout_ms} * 1'000'000;
    if (nonblock) {
      pollfd p{fd_, POLLIN, 0};
      sys::wait(&p, 1, kHoldInCallMs);  // the program's own way of sleeping
      if (detect_hello(MSG_DONTWAIT, false) != -EAGAIN || rx_ != Rx::kDetectHello) return 0;
      // Told writable already: EAGAIN now would be what TCP never does
      // (poll said writable, then nothing fits). The bytes go out raw.
      if (writable_told_.load(std::memory_order_relaxed)) {
        RDMASHIM_DEBUG("fd %d: no Hello yet and the socket was reported writable: not held", fd());
        hold_until_ns_.store(kHoldOver, std::memory_order_relaxed);
        return 0;
      }
      RDMASHIM_DEBUG("fd %d: holding the first write for the Hello its client announced", fd());
      hold_local_.store(local, std::memory_order_relaxed);
      hold_check_ns_.store(now + kHoldFirstLookNs, std::memory_order_relaxed);
      hold_until_ns_.store(until, std::memory_order_relaxed);
    }
  }
  if (nonblock) {
    if (!hold_goes_on()) return 0;
    // As a write that found the ring full: the switch onto the ring (the
    // Hello) is then an edge for an edge-triggered waiter (tx_progress).
    tx_full_.fetch_add(1, std::memory_order_relaxed);
    return -EAGAIN;
  }
  RDMASHIM_DEBUG("fd %d: waiting for the Hello its client announced", fd());
  const uint64_t start = now_ns();
  uint64_t now = start;
  while (rx_ == Rx::kDetectHello && now < until) {
    pollfd p{fd_, POLLIN, 0};
    // In slices: a client that gives up without a Hello withdraws its
    // announcement (a remote one expires, or is consumed by the Hello it
    // announced arriving on another connection from the same address), and
    // then we stop waiting (after one last look).
    sys::wait(&p, 1, 5);  // the program's own way of sleeping
    if (detect_hello(MSG_DONTWAIT, false) != -EAGAIN) break;
    if (p.revents == 0) {
      saved = errno;
      bool still = local ? discovery::client_announced(fd_, &local) : discovery::remote_client_announced(fd_);
      errno = saved;
      if (!still) {
        (void)detect_hello(MSG_DONTWAIT, false);
        if (rx_ == Rx::kDetectHello) {
          discovery::AnnouncementTable* t = local ? nullptr : discovery::announcements();
          RDMASHIM_DEBUG("fd %d: the announcement is gone after %llu ms of waiting (%zu live): no Hello to wait for",
                         fd(), static_cast<unsigned long long>((now_ns() - start) / 1'000'000),
                         t ? t->size(now_ns()) : 0);
        }
        break;
      }
    }
    now = now_ns();
  }
  if (rx_ == Rx::kDetectHello) {
    RDMASHIM_DEBUG("fd %d: no Hello from the announced client within the setup timeout", fd());
  }
  end_hold();
  return 0;
}

// While a non-blocking first write is held: whether the hold goes on. It
// ends (for good) when the setup timeout passed or the client's
// announcement is gone (looked at 5 ms in, then at doubling intervals, by
// one caller at a time: a look costs a netlink question).
bool Connection::hold_goes_on() {
  uint64_t until = hold_until_ns_.load(std::memory_order_relaxed);
  if (until <= kHoldOver) return false;
  uint64_t now = now_ns();
  bool on = now < until;
  uint64_t check = hold_check_ns_.load(std::memory_order_relaxed);
  if (on && now >= check) {
    uint64_t started = until - uint64_t{config().setup_timeout_ms} * 1'000'000;
    uint64_t next = now + std::max<uint64_t>(kHoldFirstLookNs, now - started);
    if (hold_check_ns_.compare_exchange_strong(check, next, std::memory_order_relaxed)) {
      int saved = errno;
      bool local = hold_local_.load(std::memory_order_relaxed);
      on = local ? discovery::client_announced(fd_, &local) : discovery::remote_client_announced(fd_);
      errno = saved;
      if (!on) RDMASHIM_DEBUG("fd %d: the announcement is gone: the held write goes", fd());
    }
  }
  if (!on) end_hold();
  return on;
}

uint64_t Connection::wake_deadline() const {
  uint64_t dl = prefix_deadline_ns_.load(std::memory_order_relaxed);
  uint64_t until = hold_until_ns_.load(std::memory_order_relaxed);
  if (until > kHoldOver) {
    uint64_t hold = std::min(until, hold_check_ns_.load(std::memory_order_relaxed));
    dl = dl == 0 ? hold : std::min(dl, hold);
  }
  return dl;
}

// Both locks held. The client frames everything after its Hello.
void Connection::handle_hello(const wire::Hello& hello, const verbs::Params* params) {
  rx_ = Rx::kFramed;
  if (tx_ != Tx::kUndecided) return;  // we spoke first: no Ack; the client will send Plain
  // The client already closed (it wrote and closed, nc -q0): its FIN is
  // here and its announcement withdrawn (a client that only shut down
  // writing keeps it). It holds its socket for our Ack (deferred_close.h);
  // we send none (we stay raw) and tell its rendezvous so, and it lets go
  // at once. A peer on another host cannot be asked: it gets its Ack.
  pollfd fin{fd_, POLLRDHUP, 0};
  bool local = false;
  if (sys::real().poll(&fin, 1, 0) == 1 && (fin.revents & POLLRDHUP) && !discovery::client_announced(fd_, &local) &&
      local) {
    RDMASHIM_DEBUG("fd %d: the client closed before our Ack: staying on TCP", fd());
    if (hello.transports & wire::kTransportShm) shm::send_refusal(hello.rendezvous, hello.nonce);
    tx_ = Tx::kRaw;
    settle(stats::Outcome::kTcpSetupFailed);
    return;
  }

  struct {
    wire::Ack ack;
    wire::ParamsFrame params;
  } msg{};
  wire::Ack& ack = msg.ack;
  size_t len = sizeof ack;
  memcpy(ack.magic, wire::kAckMagic, sizeof ack.magic);
  ack.version = wire::kVersion;
  memcpy(ack.nonce, hello.nonce, sizeof ack.nonce);
  if (hello.flags & wire::kHelloFlagDowngrade) {  // an older client never gets a Downgrade
    ack.flags |= wire::kAckFlagDowngrade;
    peer_downgrades_.store(true, std::memory_order_release);
  }
  stats::Outcome failure = stats::Outcome::kTcpPolicy;
  const Config& cfg = config();
  bool allowed = upgrades_allowed() && cfg.transport != TransportChoice::kTcp;
  // A Hello from another protocol version (or asking for what we do not
  // know) gets a negative Ack: both stay on TCP, never on a guessed layout.
  if (allowed && !wire::hello_understood(hello)) {
    RDMASHIM_DEBUG("fd %d: Hello version %u flags %#x not understood: staying on TCP", fd(), hello.version,
                   hello.flags);
    allowed = false;
    failure = stats::Outcome::kTcpSetupFailed;
  }
  // Verbs when the client offers it and shared memory is not the better
  // choice (a peer on another host offers only verbs).
  bool want_verbs = allowed && params && (hello.transports & wire::kTransportVerbs) &&
                    cfg.transport != TransportChoice::kShm &&
                    (cfg.transport == TransportChoice::kVerbs || !(hello.transports & wire::kTransportShm));
  // A client on another host: our device may be software (verbs/policy.h).
  if (want_verbs && !(hello.transports & wire::kTransportShm) && !peer_is_local(fd_) &&
      verbs::remote_refused(&detail_)) {
    want_verbs = false;
    ack.fallback = wire::kFallbackSoftware;
  }
  if (want_verbs) {
    int err = -EPROTO;
    sockaddr_storage local{};
    socklen_t llen = sizeof local;
    std::unique_ptr<verbs::VerbsTransport> t;
    const char* limit = nullptr;
    // Our receive ring is ours to size: the client's offer, never more than
    // what TCP would buffer here (the peer cannot make us pin more).
    size_t ring = verbs::params_plausible(*params)
                      ? verbs::negotiated_ring_size(params->ring_size, verbs::VerbsTransport::ring_size_for(fd_))
                      : 0;
    if (ring && sys::real().getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &llen) == 0) {
      t = verbs::VerbsTransport::prepare(reinterpret_cast<sockaddr*>(&local), ring, &err, &limit);
    }
    if (t && (err = t->connect(*params, ring)) == 0) {
      ack.transport = wire::kTransportVerbs;
      ack.ring_size = static_cast<uint32_t>(ring);
      msg.params.header = {wire::kParamsBytes, static_cast<uint16_t>(wire::FrameType::kParams), 0};
      memcpy(msg.params.params, &t->local_params(), wire::kParamsBytes);
      len += sizeof msg.params;
      adopt(std::move(t));
    } else if (err == -EDQUOT) {
      failure = stats::Outcome::kTcpVerbsLimit;  // the client is told so (kFallbackVerbsLimit)
      detail_ = limit;
    } else if (fds::exhausted(err)) {
      failure = stats::Outcome::kTcpFdBudget;
    } else {
      failure = stats::Outcome::kTcpSetupFailed;
      RDMASHIM_DEBUG("fd %d: verbs setup failed: %s", fd(), strerror(-err));
    }
  }
  if (!transport_ && allowed && (hello.transports & wire::kTransportShm) && cfg.transport != TransportChoice::kVerbs) {
    int err = -EIO;  // no token (getrandom failed): a setup failure too, not policy
    // The ring holds what TCP would buffer either way: the client's stream
    // also in the client's send buffer (Hello::sndbuf), ours only in what
    // we would buffer alone, whatever the client says.
    size_t own = tcp_equivalent_ring_size(fd_);
    size_t ring = ring_size_for_client(fd_, own, hello.sndbuf);
    auto t = !RDMASHIM_FAULT(kRandom) && random_bytes(ack.token, sizeof ack.token)
                 ? shm::ShmTransport::offer(ring, own, hello.rendezvous, hello.nonce, ack.token, &err) : nullptr;
    if (t) {
      ack.transport = wire::kTransportShm;
      ack.ring_size = static_cast<uint32_t>(ring);
      if (!may_follow_exec()) t->close_memfd();  // handed over and mapped
      adopt(std::move(t));
    } else {
      failure = fds::exhausted(err) ? stats::Outcome::kTcpFdBudget : stats::Outcome::kTcpSetupFailed;
      RDMASHIM_DEBUG("fd %d: shared-memory setup failed: %s", fd(), strerror(-err));
    }
  }
  if (!transport_ && ack.fallback != wire::kFallbackSoftware) {
    ack.fallback = failure == stats::Outcome::kTcpPolicy        ? wire::kFallbackPolicy
                   : failure == stats::Outcome::kTcpFdBudget    ? wire::kFallbackFdBudget
                   : failure == stats::Outcome::kTcpVerbsLimit ? wire::kFallbackVerbsLimit
                                                                : wire::kFallbackSetupFailed;
  }
  RDMASHIM_SCHED_POINT(kHandshakeSendAck);
  if (send_all(fd_, &msg, len) != 0) {
    // The client is gone or wedged; nothing more of ours goes out.
    tx_ = Tx::kRaw;
    update_passthrough();
    settle(stats::Outcome::kTcpSetupFailed);
    return;
  }
  RDMASHIM_SCHED_POINT(kHandshakeAckSent);
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
  RDMASHIM_SCHED_POINT(kHandshakeAwaitAck);
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
  segment_fds_.reset();
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
  peer_downgrades_.store((ack.flags & wire::kAckFlagDowngrade) != 0, std::memory_order_release);
  RDMASHIM_SCHED_POINT(kHandshakeAttach);
  segment_fds_.reset();  // the room kept for the segment is the segment's now
  if (ack.version == wire::kVersion && ack.transport == wire::kTransportShm && valid_ring_size(ack.ring_size)) {
    // The descriptors must come from the user that owns the server's end
    // of this connection (looked up in make_client). The rendezvous socket
    // becomes our doorbell.
    auto t = shm::ShmTransport::accept(std::move(rendezvous_fd_), nonce_, ack.token, server_uid_, ack.ring_size, &err);
    if (t && !may_follow_exec()) t->close_memfd();
    if (t) adopt(std::move(t));
  } else if (ack.version == wire::kVersion && ack.transport == wire::kTransportVerbs && params && verbs_ &&
             ack.ring_size == params->ring_size &&
             verbs::ring_size_acceptable(ack.ring_size, verbs_->local_params().ring_size)) {
    // The server's QP is already connected to ours: once ours is, we may
    // write. Its ring may be smaller than ours: we use that much of ours.
    if ((err = verbs_->connect(*params, ack.ring_size)) == 0) adopt(std::move(verbs_));
    ok = stats::Outcome::kVerbs;
  }
  rendezvous_fd_.reset();
  verbs_.reset();
  if (!transport_) {
    if (ack.transport == 0) rx_ = Rx::kRaw;  // a negative Ack is followed by raw bytes
    if (ack.transport != 0) RDMASHIM_DEBUG("fd %d: attaching the transport failed: %s", fd(), strerror(-err));
    tx_go_plain();
    // The server says why it declined (an older one does not: policy).
    bool declined_by_policy = ack.transport == 0 && ack.fallback != wire::kFallbackSetupFailed &&
                              ack.fallback != wire::kFallbackFdBudget && ack.fallback != wire::kFallbackVerbsLimit;
    bool budget = ack.transport == 0 ? ack.fallback == wire::kFallbackFdBudget : fds::exhausted(err);
    bool limit = ack.transport == 0 && ack.fallback == wire::kFallbackVerbsLimit;
    if (ack.transport == 0 && ack.fallback == wire::kFallbackSoftware) detail_ = "server: software rdma";
    if (limit) detail_ = "server: verbs limit";
    settle(declined_by_policy ? stats::Outcome::kTcpPolicy
           : budget           ? stats::Outcome::kTcpFdBudget
           : limit            ? stats::Outcome::kTcpVerbsLimit
                              : stats::Outcome::kTcpSetupFailed);
    update_passthrough();
    return;
  }
  transport_->mark_attached();
  tx_go_ring();
  settle(ok);
}

// Whether this socket survives exec, and so may need the segment's memfd
// there (see ShmTransport::describe_for_exec). Under a seccomp filter we ask
// nothing and keep it.
bool Connection::may_follow_exec() const {
  if (sandbox() != Sandbox::kNone) return true;
  int fl = sys::real().fcntl(fd_, F_GETFD);
  return fl < 0 || (fl & FD_CLOEXEC) == 0;
}

// Both locks held.
void Connection::adopt(std::unique_ptr<Transport> t) {
  ring_.reset(new (std::nothrow) RingChannel(t->link()));
  if (!ring_) return;
  transport_ = std::move(t);
  transport_->link().set_exit_notice({&Connection::cut_at_exit, this});
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_fd_ = transport_->link().wait_fd();
  }
  prepare_user_copy();  // the ring's copies need it, maybe after a filter went in
  // Under a filter, ask now (the handshake's calls went through): the data
  // path may not ask later. Otherwise lazily, at the first wait.
  if (sandbox() != Sandbox::kNone) prime_options();
}

// Both locks held: the peer said Plain, so its direction is raw from now on
// and ours follows as soon as we are at a frame boundary.
void Connection::on_peer_plain() {
  rx_ = Rx::kRaw;
  if (tx_ == Tx::kFramed) tx_go_plain();
  settle(stats::Outcome::kTcpSetupFailed, true);  // also if we had counted the peer as attached
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
    sys::wait(&p, 1, static_cast<int>((give_up - now) / 1'000'000) + 1);
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
// Switching a direction

// Applies a pending switch (to the ring or to plain) at a frame boundary.
void Connection::advance_tx(bool data_follows) {
  if (tx_ != Tx::kFramed || tx_hdr_left_ != 0 || tx_frame_left_ != 0) return;
  if (tx_want_ == TxWant::kNone && role_ == Role::kServer && transport_ && transport_->peer_attached()) {
    tx_want_ = TxWant::kRing;
  }
  if (tx_want_ == TxWant::kNone) return;
  wire::FrameType type = tx_want_ == TxWant::kRing ? wire::FrameType::kSwitch : wire::FrameType::kPlain;
  RDMASHIM_SCHED_POINT(kSwitchSend);
  int more = type == wire::FrameType::kPlain && data_follows ? MSG_MORE : 0;
  if (send_control(type, nullptr, 0, more) != 0) return;  // try again at the next send
  RDMASHIM_SCHED_POINT(kSwitchSent);
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

}  // namespace rdmashim
