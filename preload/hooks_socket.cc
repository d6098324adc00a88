// Hooks for the socket lifecycle: creating, connecting, listening,
// accepting, duplicating and closing. Everything else about a socket
// (names, options) is the kernel's, because the descriptor stays a real
// kernel TCP socket.
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "conn/deferred_close.h"
#include "discovery/registry.h"
#include "discovery/short_lived.h"
#include "preload.h"
#include "util/config.h"
#include "util/fd_bitmap.h"
#include "util/fd_budget.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/process.h"
#include "util/schedule.h"
#include "util/stats.h"

namespace rdmashim::preload {
namespace {

bool is_tcp_socket(int fd) {
  int domain = 0, type = 0, proto = 0;
  socklen_t len = sizeof(int);
  const auto& r = real();
  if (r.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) return false;
  len = sizeof(int);
  if (r.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) return false;
  len = sizeof(int);
  if (r.getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0) return false;
  return (domain == AF_INET || domain == AF_INET6) && type == SOCK_STREAM && proto == IPPROTO_TCP;
}

// Sockets this process's socket() made as TCP (an INET stream). Only
// connect()'s path for a destination whose connections are short (plain
// TCP from the start, no Hello) trusts it, to skip its getsockopt: one
// system call of a dozen per connection. A number closed where we do not see
// it (fclose() of an fdopen()ed socket, a raw system call) and reused by
// another kind of socket keeps a stale bit, which can then only cost a wrong
// line in the log and the stats, never a byte: the upgrade path always asks
// the kernel (is_tcp_for_connect). Bits are cleared before a number is
// closed, so another thread's socket() never loses its own.
FdBitmap g_tcp_sockets;

// connect() to an AF_INET/AF_INET6 address: the protocol alone says TCP (it
// implies a stream of an INET family; a socket of another family with that
// protocol number cannot connect to an INET address, and we track only a
// connect that succeeded or is in progress). One call, not three: every
// connection pays it.
bool is_tcp_for_connect(int fd) {
  int proto = 0;
  socklen_t len = sizeof proto;
  return real().getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) == 0 && proto == IPPROTO_TCP;
}

void add_alias(Entry* e, int fd) {
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->alias_count < Entry::kMaxAliases) e->aliases[e->alias_count++] = fd;
}

// Registers e under fd as a new name for it.
void attach(int fd, Entry* e) {
  add_alias(e, fd);
  if (!table().set(fd, e)) {
    // Beyond the table's range: the descriptor stays untracked and plain.
    std::lock_guard<std::mutex> lock(e->mu);
    --e->alias_count;
  }
}

// Forgets fd as a name of e; keeps the connection pointed at an open one.
void detach(int fd, Entry* e) {
  std::lock_guard<std::mutex> lock(e->mu);
  for (int i = 0; i < e->alias_count; ++i) {
    if (e->aliases[i] == fd) {
      e->aliases[i] = e->aliases[--e->alias_count];
      break;
    }
  }
  if (e->conn && e->conn->fd() == fd && e->alias_count > 0) e->conn->set_fd(e->aliases[0]);
}

// The entry of a listener under rdmashim, advertised on this host and over
// RDMA-CM; nullptr if fd has no address with a port yet.
// A second listener of the same port (SO_REUSEPORT) shares the first one's
// advertisement: the bind fails and we still accept as a listener under rdmashim.
Entry* listener_entry(int fd) {
  sockaddr_storage self{};
  socklen_t len = sizeof self;
  if (real().getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0) return nullptr;
  uint16_t port = self.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&self)->sin_port
                  : self.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&self)->sin6_port
                                                 : 0;
  if (port == 0) return nullptr;
  auto* e = new (std::nothrow) Entry(Entry::Kind::kListener);
  if (!e) return nullptr;
  e->advert = discovery::advertise(reinterpret_cast<sockaddr*>(&self), len);
  e->syns_kept = discovery::keep_syns(fd);
  e->remote = discovery::advertise_remote(reinterpret_cast<sockaddr*>(&self), len);
  e->had_remote = e->remote != nullptr;
  return e;
}

void advertise_listener(int fd) {
  if (Entry* e = listener_entry(fd)) attach(fd, e);
}

// Before accept (which may block): a listener this process did not make
// answers probes from here too. One inherited through exec or socket
// activation is advertised now; one inherited through fork takes over its
// parent's RDMA-CM advertisement, or waits for it to go (discovery/remote.h).
void prepare_accept(int listener) {
  if (config().disabled) return;
  int saved = errno;
  if (Ref l = table().get(listener)) {
    take_over_listener(*l.get());
  } else if (is_tcp_socket(listener)) {
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (real().getsockopt(listener, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting) {
      advertise_listener(listener);
    }
  }
  errno = saved;
}

// After accept: an accepted socket of a listener under rdmashim. `blocking`:
// accepted without O_NONBLOCK (Connection::make_server).
int track_accepted(int listener, int fd, bool blocking) {
  if (fd < 0 || config().disabled) return fd;  // RDMASHIM_DISABLE: untouched, not even advertised
  int saved = errno;
  Ref l = table().get(listener);
  if (l && l->kind.load() == Entry::Kind::kListener) {
    std::unique_ptr<Connection> conn = Connection::make_server(fd, l->syns_kept.load(std::memory_order_relaxed), blocking);
    auto* e = conn ? new (std::nothrow) Entry(Entry::Kind::kStream) : nullptr;
    if (e) {
      e->conn = std::move(conn);
      attach(fd, e);
    }
  }
  errno = saved;
  return fd;
}

// The last close of a verbs connection whose writes are still in flight:
// deferred_close.h finishes the flush in the background, holding a reference
// to the entry (so the connection outlives the program's close, as a call in
// flight keeps it). Without a descriptor or thread for that, the flush ends
// here, as before.
bool hold_while_flushing(int fd, Entry* e, unsigned first, unsigned last) {
  struct Held {
    static bool step(void* ctx, int held_fd, bool last) {
      return static_cast<Entry*>(ctx)->conn->linger_step(held_fd, last);
    }
    static void release(void* ctx) { unref(static_cast<Entry*>(ctx)); }
  };
  e->refs.fetch_add(1, std::memory_order_relaxed);
  deferred_close::Flushing what{&Held::step, &Held::release, e};
  if (deferred_close::hold_flushing(fd, what, e->conn->linger_deadline(), first, last)) return true;
  unref(e);  // the table's reference still holds it
  e->conn->finish_flush();
  return false;
}

// close() of fd is about to happen: forgets the name, and if it was the
// connection's last, lets it finish what must precede the kernel's close.
// Returns the table's reference, for release_after_close().
Entry* forget_before_close(int fd, unsigned first, unsigned last) {
  Entry* e = table().take(fd);
  if (!e) return nullptr;
  detach(fd, e);
  // A record the program deleted but we kept must not outlive the number:
  // the kernel forgets it now, and the number may come back as another socket.
  if (e->lingering.load(std::memory_order_relaxed) > 0) forget_in_epoll_sets(fd, true);
  bool last_name = false;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    last_name = e->alias_count == 0;
  }
  if (last_name && e->conn) {
    int saved = errno;
    switch (e->conn->drain_before_close(first, last)) {
      case Connection::Drain::kHeld:
        forget_in_epoll_sets(fd);
        break;
      case Connection::Drain::kFlushing:
        if (hold_while_flushing(fd, e, first, last)) forget_in_epoll_sets(fd);
        break;
      case Connection::Drain::kClose:
        break;
    }
    RDMASHIM_SCHED_POINT(kCloseReal);
    errno = saved;
  }
  // Only established connections teach anything (a refused one is no short connection).
  if (last_name && e->connected_ns != 0 && e->kind.load() == Entry::Kind::kStream) {
    discovery::note_closed(reinterpret_cast<sockaddr*>(&e->peer), e->peer_len, e->connected_ns, now_ns());
  }
  return e;
}

void release_after_close(Entry* e) {
  if (!e) return;
  int saved = errno;
  unref(e);  // the last name gone: the connection and its rings go too
  errno = saved;
}

// close_range()/closefrom(): every tracked name in [first, last].
std::vector<Entry*> forget_range(unsigned first, unsigned last) {
  std::vector<int> fds;
  table().for_each_fd([&](int fd) {
    if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last) fds.push_back(fd);
  });
  std::vector<Entry*> gone;
  for (int fd : fds) {
    if (Entry* e = forget_before_close(fd, first, last)) gone.push_back(e);
  }
  return gone;
}

}  // namespace

// Without an RDMA-CM advertisement (no device) there is nothing to take
// over, and no lock to take at every accept.
void take_over_listener(Entry& l) {
  if (l.kind.load() != Entry::Kind::kListener || !l.had_remote) return;
  int saved = errno;
  std::lock_guard<std::mutex> lock(l.mu);  // two threads of one child
  discovery::take_over_remote(&l.remote);
  errno = saved;
}

void adopt_socket(const std::vector<int>& names, const std::string& state) {
  if (names.empty()) return;
  struct stat first{};
  if (fstat(names[0], &first) != 0 || !is_tcp_socket(names[0])) return;
  for (int fd : names) {
    struct stat st{};
    // A name that is no longer the same socket, or already known: leave all alone.
    if (table().get(fd) || fstat(fd, &st) != 0 || st.st_ino != first.st_ino || st.st_dev != first.st_dev) return;
  }
  std::unique_ptr<Connection> conn = state.empty() ? Connection::make_server(names[0])
                                                   : Connection::adopt_described(names[0], state.c_str());
  auto* e = conn ? new (std::nothrow) Entry(Entry::Kind::kStream) : nullptr;
  if (!e) return;
  e->conn = std::move(conn);
  for (int fd : names) attach(fd, e);
}

static void remember_peer(Entry* e, const sockaddr* peer, socklen_t len, uint64_t connected_ns) {
  memcpy(&e->peer, peer, len < sizeof e->peer ? len : sizeof e->peer);
  e->peer_len = len;
  e->connected_ns = connected_ns;
}

// A client socket that stays plain keeps an entry without a connection, so
// that a second connect() (how non-blocking clients such as hiredis learn the
// first completed) neither sends a Hello nor counts the connection again.
// It also keeps where it connected and when, for discovery/short_lived.h.
static void remember_plain(int fd, const sockaddr* peer, socklen_t len, uint64_t connected_ns) {
  if (table().get(fd)) return;
  if (auto* e = new (std::nothrow) Entry(Entry::Kind::kStream)) {
    remember_peer(e, peer, len, connected_ns);
    attach(fd, e);
  }
}

// `advertised`: the rules, the same-host registry or (`remote`) another
// host's RDMA-CM answer, all asked before connect(). Another host's "no" is
// remembered only now that the connection exists (a server not up yet must
// not be cached as plain for a minute).
void track_client(int fd, const sockaddr* peer, socklen_t len, bool advertised, discovery::Announcement announce,
                  const discovery::RemoteProbe& remote, uint64_t connected_ns) {
  if (remote.answer == discovery::RemoteAnswer::kNo) discovery::remember_remote_no(peer, len);
  if (!advertised) {
    const char* refusal = discovery::remote_refusal(peer, len);
    auto why = refusal || discovery::peer_rule(peer, len) == discovery::PeerRule::kForbid
                   ? stats::Outcome::kTcpPolicy
                   : stats::Outcome::kTcpNotAdvertised;
    stats::count(why);
    if (refusal) RDMASHIM_INFO("fd %d (client) -> %s (%s)", fd, stats::name(why), refusal);
    else RDMASHIM_INFO("fd %d (client) -> %s", fd, stats::name(why));
    remember_plain(fd, peer, len, connected_ns);
    return;
  }
  std::unique_ptr<Connection> conn =
      Connection::make_client(fd, std::move(announce), remote.announced ? remote.nonce : nullptr);
  if (!conn) {
    remember_plain(fd, peer, len, connected_ns);
    return;
  }
  auto* e = new (std::nothrow) Entry(Entry::Kind::kStream);
  if (!e) {
    conn.reset();  // the Hello went out: without an entry the stream would be garbled
    return;
  }
  e->conn = std::move(conn);
  remember_peer(e, peer, len, connected_ns);
  attach(fd, e);
}

}  // namespace rdmashim::preload

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

// Keeps the value the program just set where the data path needs it: asking
// the kernel again later may not be allowed by then (a seccomp sandbox).
void note_socket_option(Connection& c, int name, const void* val, socklen_t len) {
  if (name == SO_RCVLOWAT) {
    int v = -1;
    if (val && len >= static_cast<socklen_t>(sizeof(int))) {
      memcpy(&v, val, sizeof v);
      v = v < 0 ? INT_MAX : (v == 0 ? 1 : v);
    }
    c.rcvlowat_changed(v);
    return;
  }
  bool rcv = name == SO_RCVTIMEO || name == SO_RCVTIMEO_NEW;
  if (!rcv && name != SO_SNDTIMEO && name != SO_SNDTIMEO_NEW) return;
  int64_t ns = -1;  // ask the kernel
  struct { int64_t sec, usec; } tv{};  // timeval and __kernel_sock_timeval alike on 64-bit
  if (sizeof(timeval) == sizeof tv && val && len >= static_cast<socklen_t>(sizeof tv)) {
    memcpy(&tv, val, sizeof tv);
    if (tv.sec >= 0 && tv.usec >= 0 && tv.usec < 1'000'000 && tv.sec < INT32_MAX) ns = tv.sec * 1'000'000'000 + tv.usec * 1000;
  }
  c.timeouts_changed(rcv ? SO_RCVTIMEO : SO_SNDTIMEO, ns);
}

}  // namespace

extern "C" {

int socket(int domain, int type, int protocol) {
  int fd = real().socket(domain, type, protocol);
  if ((domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
      (protocol == 0 || protocol == IPPROTO_TCP)) {
    g_tcp_sockets.set(fd);
  } else {
    g_tcp_sockets.clear(fd);
  }
  return fd;
}

int connect(int fd, const sockaddr* addr, socklen_t len) {
  int saved = errno;
  bool inet = !config().disabled && addr && len >= sizeof(sa_family_t) &&
              (addr->sa_family == AF_INET || addr->sa_family == AF_INET6) && !table().get(fd);
  uint64_t now = inet ? now_ns() : 0;
  bool short_dest = inet && discovery::skip_short(addr, len, now);
  bool ours = inet && ((short_dest && g_tcp_sockets.has(fd)) || is_tcp_for_connect(fd));
  if (ours && short_dest) {
    // Recent connections there were short: plain TCP from the start, at
    // TCP's cost (no discovery, no announcement, no Hello).
    errno = saved;
    int r = real().connect(fd, addr, len);
    if (r != 0 && errno != EINPROGRESS) return r;
    saved = errno;
    stats::count(stats::Outcome::kTcpPolicy);
    RDMASHIM_INFO("fd %d (client) -> %s (short connections)", fd, stats::name(stats::Outcome::kTcpPolicy));
    // A non-blocking one may yet be refused: it teaches nothing.
    remember_plain(fd, addr, len, r == 0 ? now : 0);
    errno = saved;
    return r;
  }
  // Asked before connecting: a one-shot server may close its listener, and
  // with it the advertisement, the moment it has accepted us.
  bool advertised = ours && discovery::peer_advertised(addr, len);
  // Before the SYN: a server that speaks first must find it at accept.
  // Only from a client that will send a Hello (no server waits in vain).
  discovery::Announcement announce;
  if (advertised && upgrades_allowed()) announce = discovery::announce_client(fd, addr, len);
  // Another host is asked over RDMA-CM, also before the SYN, and told in the
  // same request that our Hello follows: its server may speak first.
  discovery::RemoteProbe remote;
  if (ours) discovery::ask_remote(addr, len, upgrades_allowed(), &remote);
  if (remote.answer == discovery::RemoteAnswer::kYes) advertised = true;
  errno = saved;
  int r = real().connect(fd, addr, len);
  if (RDMASHIM_UNLIKELY(r != 0 && errno == ECONNREFUSED && remote.answer == discovery::RemoteAnswer::kNo)) {
    saved = errno;
    discovery::note_refused(addr, len);
    errno = saved;
  }
  if (!ours || (r != 0 && errno != EINPROGRESS)) return r;
  saved = errno;
  if (r == 0) {
    track_client(fd, addr, len, advertised, std::move(announce), remote, now);
  } else if (auto* e = new (std::nothrow) Entry(Entry::Kind::kPending)) {
    // Non-blocking connect: the Hello goes out at the first I/O once it completed.
    remember_peer(e, addr, len, now);
    e->advertised = advertised;
    e->counted_connecting = advertised;
    if (advertised) g_connecting_clients.fetch_add(1, std::memory_order_relaxed);
    e->probe = remote;
    e->announce = std::move(announce);
    attach(fd, e);
  }
  errno = saved;
  return r;
}

int listen(int fd, int backlog) {
  int saved = errno;
  if (config().disabled || table().get(fd) || !is_tcp_socket(fd)) {
    errno = saved;
    return real().listen(fd, backlog);
  }
  // Advertised before the kernel takes connections: a client that connects
  // the moment listen() returns finds us, and one on another host does not
  // get (and cache) a "no" from RDMA-CM. Unbound sockets get their port from
  // listen() itself, so they are advertised after it.
  Entry* e = listener_entry(fd);
  errno = saved;
  int r = real().listen(fd, backlog);
  saved = errno;
  if (r != 0) {
    delete e;
  } else if (e) {
    attach(fd, e);
  } else {
    advertise_listener(fd);
  }
  errno = saved;
  return r;
}

int accept(int fd, sockaddr* addr, socklen_t* len) {
  prepare_accept(fd);
  return track_accepted(fd, real().accept(fd, addr, len), true);
}

int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  prepare_accept(fd);
  return track_accepted(fd, real().accept4(fd, addr, len, flags), !(flags & SOCK_NONBLOCK));
}

int close(int fd) {
  // One of ours (a doorbell, say) is no descriptor the program opened: on
  // TCP that number would not be open (a daemon closing every number).
  if (fds::is_ours(fd)) return syscall_result(-EBADF);
  if (deferred_close::any()) {
    if (deferred_close::owns(fd)) return syscall_result(-EBADF);  // ours, not the program's
    deferred_close::reap();
  }
  Entry* e = forget_before_close(fd, static_cast<unsigned>(fd), static_cast<unsigned>(fd));
  g_tcp_sockets.clear(fd);
  int r = real().close(fd);
  release_after_close(e);
  return r;
}

int close_range(unsigned int first, unsigned int last, int flags) {
  using Fn = int (*)(unsigned int, unsigned int, int);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "close_range"));
  auto call = [&] { return next ? next(first, last, flags) : static_cast<int>(syscall(SYS_close_range, first, last, flags)); };
  // Only a plain close of a valid range forgets names; anything else (CLOEXEC,
  // bad arguments) closes nothing we track. Nor does a kernel before 5.9
  // (ENOSYS): asked once with an empty range, which a kernel that has the
  // call refuses with EINVAL.
  static const bool missing = [] {
    int saved = errno;
    bool m = syscall(SYS_close_range, 1U, 0U, 0) < 0 && errno == ENOSYS;
    errno = saved;
    return m;
  }();
  if (missing || first > last || (flags & ~CLOSE_RANGE_UNSHARE) != 0) return call();
  if (deferred_close::any()) deferred_close::vacate(first, last);
  std::vector<Entry*> gone = forget_range(first, last);
  g_tcp_sockets.clear_range(first, last);
  // Our own descriptors in the range (a connection's doorbells) stay open:
  // the program closes what it opened.
  struct Ctx {
    Fn next;
    int flags;
  } ctx{next, flags};
  int r = fds::for_each_gap(first, last, [](unsigned a, unsigned b, void* c) {
    auto* x = static_cast<Ctx*>(c);
    return x->next ? x->next(a, b, x->flags) : static_cast<int>(syscall(SYS_close_range, a, b, x->flags));
  }, &ctx);
  for (Entry* e : gone) release_after_close(e);
  return r;
}

void closefrom(int lowfd) {
  using Fn = void (*)(int);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "closefrom"));
  if (lowfd < 0) lowfd = 0;
  if (deferred_close::any()) deferred_close::vacate(static_cast<unsigned>(lowfd), ~0U);
  std::vector<Entry*> gone = forget_range(static_cast<unsigned>(lowfd), ~0U);
  g_tcp_sockets.clear_range(static_cast<unsigned>(lowfd), ~0U);
  // As close_range: ours stay. Below the last of ours one gap at a time
  // (close_range, else each number), then glibc's closefrom for the rest.
  fds::for_each_gap(static_cast<unsigned>(lowfd), ~0U, [](unsigned a, unsigned b, void* c) {
    auto next = reinterpret_cast<Fn>(c);
    if (b == ~0U) {
      if (next) next(static_cast<int>(a));
      else syscall(SYS_close_range, a, b, 0);
    } else if (syscall(SYS_close_range, a, b, 0) != 0) {
      for (unsigned fd = a; fd <= b; ++fd) real().close(static_cast<int>(fd));
    }
    return 0;
  }, reinterpret_cast<void*>(next));
  for (Entry* e : gone) release_after_close(e);
}

int shutdown(int fd, int how) {
  if (Ref s = active_stream(fd)) return syscall_result(s->conn->shutdown(how));
  return real().shutdown(fd, how);
}

int dup(int fd) {
  int r = real().dup(fd);
  if (r >= 0) {
    if (Ref e = table().get(fd)) attach(r, e.get());
  }
  return r;
}

static int dup_onto(int oldfd, int newfd, int r) {
  if (r < 0 || oldfd == newfd) return r;
  // newfd was closed by the kernel as part of the call.
  if (Entry* old = table().take(newfd)) {
    detach(newfd, old);
    unref(old);
  }
  if (Ref e = table().get(oldfd)) attach(newfd, e.get());
  return r;
}

// A number we hold (deferred_close.h) is free as far as the program knows.
static void vacate_for(int oldfd, int newfd) {
  if (deferred_close::any() && oldfd != newfd && newfd >= 0 && !deferred_close::owns(oldfd)) {
    deferred_close::vacate(static_cast<unsigned>(newfd), static_cast<unsigned>(newfd));
  }
}

int dup2(int oldfd, int newfd) {
  vacate_for(oldfd, newfd);
  if (oldfd != newfd) g_tcp_sockets.clear(newfd);
  return dup_onto(oldfd, newfd, real().dup2(oldfd, newfd));
}
int dup3(int oldfd, int newfd, int flags) {
  vacate_for(oldfd, newfd);
  if (oldfd != newfd) g_tcp_sockets.clear(newfd);
  return dup_onto(oldfd, newfd, real().dup3(oldfd, newfd, flags));
}

int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);  // every fcntl argument fits a pointer-sized slot
  va_end(ap);
  int r = real().fcntl(fd, cmd, arg);
  if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) {
    if (Ref e = table().get(fd)) attach(r, e.get());
  }
  if (r == 0 && cmd == F_SETFL) {  // keep what the program set: asking later may not be allowed
    int nb = (reinterpret_cast<intptr_t>(arg) & O_NONBLOCK) ? 1 : 0;
    if (Ref e = table().get(fd); e && e->conn) e->conn->file_flags_changed(nb);
  }
  return r;
}

// Programs built with _FILE_OFFSET_BITS=64 call fcntl64 (the same call on 64-bit).
int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return fcntl(fd, cmd, arg);
}

int ioctl(int fd, unsigned long request, ...) {
  va_list ap;
  va_start(ap, request);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  // Queue sizes of a ring are the ring's; everything else is the socket's.
  if (request == FIONREAD || request == SIOCOUTQ) {
    if (Ref s = active_stream(fd)) {
      int64_t n = request == FIONREAD ? s->conn->unread_bytes() : s->conn->unsent_bytes();
      if (n >= 0) {
        if (!arg) return syscall_result(-EFAULT);
        *static_cast<int*>(arg) = static_cast<int>(n > INT32_MAX ? INT32_MAX : n);
        return 0;
      }
    }
  }
  if (request == SIOCATMARK) {
    if (Ref s = active_stream(fd)) {
      int m = s->conn->at_mark();
      if (m >= 0) {
        if (!arg) return syscall_result(-EFAULT);
        *static_cast<int*>(arg) = m;
        return 0;
      }
    }
  }
  int r = real().ioctl(fd, request, arg);
  if (r == 0 && request == FIONBIO) {
    int saved = errno;
    int nb = arg ? (*static_cast<const int*>(arg) != 0 ? 1 : 0) : -1;
    if (Ref e = table().get(fd); e && e->conn) e->conn->file_flags_changed(nb);
    errno = saved;
  }
  return r;
}

// glibc's sockatmark() asks the kernel directly, past our ioctl.
int sockatmark(int fd) {
  if (Ref s = active_stream(fd)) {
    int m = s->conn->at_mark();
    if (m >= 0) return m;
  }
  int answer = 0;
  return real().ioctl(fd, SIOCATMARK, &answer) < 0 ? -1 : answer;
}

// The descriptor is the kernel's socket: names and options are answered by
// the kernel as they are. These exist so that per-option emulation has one
// place to live when an option's meaning changes on a ring.
int getpeername(int fd, sockaddr* addr, socklen_t* len) { return real().getpeername(fd, addr, len); }
int getsockname(int fd, sockaddr* addr, socklen_t* len) { return real().getsockname(fd, addr, len); }
int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  int r = real().getsockopt(fd, level, name, val, len);
  if (r == 0 && level == IPPROTO_TCP && name == TCP_SAVE_SYN && *len >= static_cast<socklen_t>(sizeof(int))) {
    // Set by us on a listener (discovery/syn_mark.h): the program sees its own 0.
    if (Ref e = table().get(fd); e && e->kind.load() == Entry::Kind::kListener && e->syns_kept.load()) {
      int off = 0;
      memcpy(val, &off, sizeof off);
    }
  }
  if (r == 0 && level == SOL_SOCKET && name == SO_RCVLOWAT) {
    // Raised by us while a handshake prefix waits: the application sees its own.
    if (Ref e = table().get(fd); e && e->conn) {
      int v = e->conn->app_rcvlowat();
      if (v >= 0) memcpy(val, &v, std::min<size_t>(*len, sizeof v));
    }
  }
  return r;
}
int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  int r = real().setsockopt(fd, level, name, val, len);
  if (r == 0 && level == IPPROTO_TCP && name == TCP_SAVE_SYN) {
    // The program keeps SYNs itself: they are its to read, never ours.
    if (Ref e = table().get(fd); e && e->kind.load() == Entry::Kind::kListener) e->syns_kept.store(false);
  }
  if (r == 0 && level == SOL_SOCKET) {
    int saved = errno;
    if (Ref e = table().get(fd); e && e->conn) note_socket_option(*e->conn, name, val, len);
    errno = saved;
  }
  return r;
}

}  // extern "C"
