// Client sockets held after the program's close until their Ack came (see
// deferred_close.h): one process-wide list, under one lock.
#include "conn/deferred_close.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // tcp_info with tcpi_bytes_acked
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "conn/connection_internal.h"
#include "discovery/sockdiag.h"
#include "shm/rendezvous.h"
#include "sys/calls.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/fd_budget.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/thread.h"
#include "wire/wire.h"

namespace rdmashim::deferred_close {

std::atomic<int> g_held{0};

namespace {

struct Held {
  int fd;             // the duplicate of the program's socket, shut down for writing
  int rendezvous;     // hears a refusal; -1 if none
  uint64_t deadline;  // now_ns() after which we stop waiting
  unsigned char nonce[kNonceBytes];
  bool asked;  // unanswerable() was asked (once: it costs a netlink query)
};

// A connection finishing its flush (hold_flushing).
struct Flush {
  int fd;             // the duplicate of the program's socket, still open both ways
  uint64_t deadline;  // now_ns() after which we stop waiting
  Flushing what;
  uint64_t slow_from;  // looked at every 10 ms from then on (a reader long away)
};

// Heap-allocated and never destroyed: used from a destructor at exit, and a
// forked child replaces the lock another thread may have held at fork.
std::mutex* g_mu = new std::mutex;
std::vector<Held>* g_list = new std::vector<Held>;
std::vector<Flush>* g_flushing = new std::vector<Flush>;
bool g_flusher = false;  // the background thread runs (g_mu)
pid_t g_owner = 0;  // the process the list belongs to (a vfork child must not touch it)

void count_locked() { g_held.store(static_cast<int>(g_list->size() + g_flushing->size()), std::memory_order_relaxed); }

bool in(int fd, unsigned first, unsigned last) {
  return fd >= 0 && static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last;
}

// A duplicate of fd, close-on-exec, where rdmashim keeps its own descriptors
// (util/fd_budget.h: above the soft limit, else in the top of the range), so
// a held socket takes none of the program's numbers (no EMFILE it would not
// have had), and close_range()/closefrom() spare it. Where that has no room:
// away from [first, last] and high, so the program's lowest-free numbers stay
// as they were without us (capped: a huge RLIMIT_NOFILE must not grow the
// descriptor table to match). Closed with fds::close().
int dup_away(int fd, unsigned first, unsigned last) {
  int d = sys::real().fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d >= 0 && fds::keep(&d, 1)) return d;
  constexpr rlim_t kHighCap = 1024;
  rlimit rl{};
  long base = fd + 1;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) base = std::max<long>(base, static_cast<long>(std::min(rl.rlim_cur / 2, kHighCap)));
  long bases[2] = {base, last < INT_MAX ? static_cast<long>(last) + 1 : -1};
  for (long b : bases) {
    if (b < 0 || b > INT_MAX) continue;
    d = sys::real().fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(b));
    if (d < 0) continue;
    if (!in(d, first, last)) return d;
    sys::real().close(d);
  }
  return -1;
}

// The held socket no longer needs holding.
bool done(Held& h, uint64_t now) {
  if (now >= h.deadline) return true;
  if (h.rendezvous >= 0 && shm::take_refusal(h.rendezvous) != 0) return true;
  unsigned char m[wire::kMaxHandshakeMessage];
  ssize_t n = sys::real().recv(h.fd, m, sizeof m, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;  // reset
  if (n == 0) return true;  // the server closed: nothing more comes
  size_t have = static_cast<size_t>(n);
  if (memcmp(m, wire::kAckMagic, std::min(have, sizeof wire::kAckMagic)) != 0) return true;  // application bytes
  if (have < sizeof(wire::Ack)) return false;
  wire::Ack ack;
  memcpy(&ack, m, sizeof ack);
  if (memcmp(ack.nonce, h.nonce, sizeof h.nonce) != 0) return true;
  size_t len = conn_internal::ack_extent(m);
  if (have < len) return false;
  sys::real().recv(h.fd, m, len, MSG_DONTWAIT);  // ours: consumed, so the close is clean
  return true;
}

// No Ack can come any more: the server's socket has our FIN (CLOSE_WAIT)
// and its program has not read our Hello yet (every byte we sent, and the
// FIN's place, still queued there), so it will find the FIN with our
// announcement gone and answer with none (Connection::handle_hello). Only
// a peer on this host can be asked; a retransmission (bytes_sent counts it)
// or a kernel without tcpi_bytes_sent only makes us wait.
bool unanswerable(const Held& h) {
  constexpr uint8_t kCloseWait = 8;  // TCP_CLOSE_WAIT
  tcp_info ti{};
  socklen_t len = sizeof ti;
  discovery::TcpOwner peer;
  bool r = sys::real().getsockopt(h.fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
           len >= offsetof(tcp_info, tcpi_bytes_sent) + sizeof ti.tcpi_bytes_sent && ti.tcpi_bytes_sent != 0 &&
           discovery::Diag().tcp_peer_owner(h.fd, &peer) && peer.state == kCloseWait &&
           peer.rqueue == ti.tcpi_bytes_sent + 1;
  RDMASHIM_DEBUG("held fd %d: %s (sent %llu, the server's socket in state %u has %u unread)", h.fd,
                 r ? "no Ack can come" : "waiting for the Ack", static_cast<unsigned long long>(ti.tcpi_bytes_sent),
                 peer.state, peer.rqueue);
  return r;
}

void release(Held& h) {
  fds::close(h.fd);
  if (h.rendezvous >= 0) fds::close(h.rendezvous);
}

// g_mu held.
void reap_locked(uint64_t now) {
  auto& l = *g_list;
  for (size_t i = 0; i < l.size();) {
    if (done(l[i], now)) {
      release(l[i]);
      l[i] = l.back();
      l.pop_back();
    } else {
      ++i;
    }
  }
  count_locked();
}

// g_mu held: moves the flushes that are done (or out of time: their
// deadline, or `cap`) to `out`, whose connections are let go and duplicates
// closed outside the lock (letting go destroys a QP).
void step_flushing_locked(uint64_t now, std::vector<Flush>* out, uint64_t cap = UINT64_MAX) {
  auto& l = *g_flushing;
  for (size_t i = 0; i < l.size();) {
    const bool last = now >= std::min(l[i].deadline, cap);
    if (l[i].what.step(l[i].what.ctx, l[i].fd, last) || last) {
      out->push_back(l[i]);
      l[i] = l.back();
      l.pop_back();
    } else {
      ++i;
    }
  }
  count_locked();
}

// In this order: the connection's last words (a verbs Bye) before our FIN.
void finish(const std::vector<Flush>& done) {
  for (const Flush& f : done) {
    f.what.release(f.what.ctx);
    fds::close(f.fd);
  }
}

void pause_1ms() {
  timespec ts{0, 1'000'000};
  nanosleep(&ts, nullptr);
}

bool mine() { return g_owner == getpid(); }

// The background thread: looks at every flush each millisecond while any is
// young, every 10 ms once all waited the setup timeout, then ends
// (hold_flushing starts another).
void* flush_loop(void*) {
  for (;;) {
    std::vector<Flush> done;
    bool more, young = false;
    {
      std::lock_guard<std::mutex> lock(*g_mu);
      uint64_t now = now_ns();
      step_flushing_locked(now, &done);
      more = !g_flushing->empty();
      if (!more) g_flusher = false;
      for (const Flush& f : *g_flushing) young = young || now < f.slow_from;
    }
    finish(done);
    if (!more) return nullptr;
    for (int i = young ? 1 : 10; i > 0; --i) pause_1ms();
  }
}

}  // namespace

bool hold(int fd, const unsigned char (&nonce)[kNonceBytes], UniqueFd rendezvous, unsigned avoid_first,
          unsigned avoid_last) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] { pthread_atfork(nullptr, nullptr, after_fork_child); });
  std::lock_guard<std::mutex> lock(*g_mu);
  uint64_t now = now_ns();
  if (g_owner == 0) g_owner = getpid();  // first use in this process
  if (!mine()) return false;              // a vfork child: the list is its parent's
  reap_locked(now);
  int d = dup_away(fd, avoid_first, avoid_last);
  if (d < 0) return false;
  int r = -1;
  if (rendezvous) {
    r = dup_away(rendezvous.get(), avoid_first, avoid_last);  // its low number is freed with the Connection
  }
  // Our FIN leaves now, as the program's close() would have sent it.
  sys::real().shutdown(d, SHUT_WR);
  Held h{d, r, now + uint64_t{config().setup_timeout_ms} * 1'000'000, {}, false};
  memcpy(h.nonce, nonce, sizeof h.nonce);
  g_list->push_back(h);
  count_locked();
  RDMASHIM_DEBUG("fd %d: closed before the server's Ack: held as fd %d until it comes", fd, d);
  return true;
}

bool hold_flushing(int fd, Flushing what, uint64_t deadline, unsigned avoid_first, unsigned avoid_last) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] { pthread_atfork(nullptr, nullptr, after_fork_child); });
  std::lock_guard<std::mutex> lock(*g_mu);
  if (g_owner == 0) g_owner = getpid();
  if (!mine()) return false;
  int d = dup_away(fd, avoid_first, avoid_last);
  if (d < 0) return false;
  if (!g_flusher && !start_background_thread(flush_loop, nullptr)) {
    fds::close(d);
    return false;
  }
  g_flusher = true;
  g_flushing->push_back(Flush{d, deadline, what, now_ns() + uint64_t{config().setup_timeout_ms} * 1'000'000});
  count_locked();
  RDMASHIM_DEBUG("fd %d: ring writes still in flight at close: held as fd %d until confirmed", fd, d);
  return true;
}

void reap() {
  std::lock_guard<std::mutex> lock(*g_mu);
  if (mine()) reap_locked(now_ns());
}

void finish_all() {
  // Exit and exec wait for a flush at most the setup timeout, however long
  // its close would have let it go on in the background.
  const uint64_t cap = now_ns() + uint64_t{config().setup_timeout_ms} * 1'000'000;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Flush> flushed;
    uint64_t now = now_ns(), until = UINT64_MAX;
    bool flushing;
    {
      std::lock_guard<std::mutex> lock(*g_mu);
      if (!mine()) return;
      step_flushing_locked(now, &flushed, cap);
      flushing = !g_flushing->empty();
      reap_locked(now);
      for (size_t i = 0; i < g_list->size();) {  // at exit nobody waits for what cannot come
        Held& h = (*g_list)[i];
        if (!h.asked && (h.asked = true, unanswerable(h))) {
          release(h);
          h = g_list->back();
          g_list->pop_back();
        } else {
          ++i;
        }
      }
      count_locked();
      for (const Held& h : *g_list) {
        fds.push_back({h.fd, POLLIN, 0});
        if (h.rendezvous >= 0) fds.push_back({h.rendezvous, POLLIN, 0});
        until = std::min(until, h.deadline);
      }
    }
    finish(flushed);
    if (fds.empty() && !flushing) return;
    int ms = static_cast<int>(std::min<uint64_t>((until - std::min(until, now)) / 1'000'000 + 1, INT_MAX));
    if (flushing) ms = 1;  // flushes are looked at, not waited on
    sys::wait(fds.data(), fds.size(), ms);
  }
}

bool owns(int fd) {
  std::lock_guard<std::mutex> lock(*g_mu);
  if (!mine()) return false;
  for (const Held& h : *g_list) {
    if (h.fd == fd || h.rendezvous == fd) return true;
  }
  for (const Flush& f : *g_flushing) {
    if (f.fd == fd) return true;
  }
  return false;
}

namespace {
// `fd`, if in [first, last], moves to a number outside it. false: nowhere to go.
bool move_away(int& fd, unsigned first, unsigned last) {
  if (!in(fd, first, last)) return true;
  int d = dup_away(fd, first, last);
  if (d < 0) return false;
  fds::close(fd);
  fd = d;
  return true;
}
}  // namespace

void vacate(unsigned first, unsigned last) {
  std::lock_guard<std::mutex> lock(*g_mu);
  if (!mine()) return;
  auto& l = *g_list;
  for (size_t i = 0; i < l.size();) {
    Held& h = l[i];
    if (!move_away(h.rendezvous, first, last)) {  // only the refusal is lost
      fds::close(h.rendezvous);
      h.rendezvous = -1;
    }
    if (!move_away(h.fd, first, last)) {  // let go now (an Ack landing later draws the RST)
      done(h, now_ns());
      release(h);
      l[i] = l.back();
      l.pop_back();
      continue;
    }
    ++i;
  }
  std::vector<Flush> gone;
  auto& fl = *g_flushing;
  for (size_t i = 0; i < fl.size();) {
    if (!move_away(fl[i].fd, first, last)) {  // let go now, our FIN maybe ahead of writes in flight
      gone.push_back(fl[i]);
      fl[i] = fl.back();
      fl.pop_back();
      continue;
    }
    ++i;
  }
  count_locked();
  finish(gone);  // under g_mu: rare, and the duplicates must be gone before the program's close_range
}

void after_fork_child() {
  new (g_mu) std::mutex;  // the parent's may have been held at fork by another thread
  if (g_owner != 0) {
    for (Held& h : *g_list) release(h);  // our copies only: the parent's stay open
  }
  g_list->clear();
  if (g_owner != 0) {
    // Our copies of the duplicates; the connections are the parent's (their
    // QPs are shared with it): left alone, never let go here.
    for (Flush& f : *g_flushing) fds::close(f.fd);
  }
  g_flushing->clear();
  g_flusher = false;  // threads do not survive fork
  g_owner = 0;
  g_held.store(0, std::memory_order_relaxed);
}

namespace {
// exit(): the held sockets must not be dropped with an Ack on its way.
__attribute__((destructor)) void finish_at_exit() {
  if (any()) finish_all();
}
}  // namespace

}  // namespace rdmashim::deferred_close
