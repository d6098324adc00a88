// Client sockets whose non-blocking connect is still in progress, as the
// wait hooks see them (wait_common.h).
//
// Such a client sends its Hello at its first call after the connect
// completed. A program that meanwhile waits for its server's greeting only
// (poll for POLLIN, epoll for EPOLLIN: SMTP, MySQL, SSH clients) is not woken
// by the connect, so that call would come only with the greeting, and a
// server under rdmashim, which waits for an announced client's Hello before
// speaking, would wait up to the setup timeout and stay on TCP. So the wait
// hooks also watch these sockets for writability (the connect completing,
// or failing) and settle them at once: the Hello leaves, or a refused
// connect withdraws its announcement. What the program sees is unchanged.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "epoll_set.h"
#include "preload.h"
#include "wait_common.h"

namespace rdmashim::preload {

bool connecting_client(int fd) {
  if (fd < 0) return false;
  Ref e = table().get(fd);
  // `advertised` is set before the entry is attached and never changes.
  return e && e->kind.load(std::memory_order_relaxed) == Entry::Kind::kPending && e->advertised;
}

bool settle_connecting(int fd) {
  int saved = errno;
  Ref s = active_stream(fd);  // completes the connect's settling: the Hello goes out
  errno = saved;
  return !connecting_client(fd);
}

namespace {

void collect_connecting(EpollSet& set, std::vector<pollfd>& watch, const std::vector<int>& quiet, int depth) {
  std::lock_guard<std::mutex> lock(set.mu);
  for (const NativeReg& n : set.natives) {
    bool seen = std::any_of(watch.begin(), watch.end(), [&](const pollfd& w) { return w.fd == n.fd; });
    if (!seen && connecting_client(n.fd) && std::find(quiet.begin(), quiet.end(), n.fd) == quiet.end()) {
      watch.push_back({n.fd, POLLOUT, 0});
    }
  }
  // A set registered in this one wakes it: its clients count as ours.
  for (auto& r : set.regs) {
    if (EpollSet* in = r->inner(); in && depth < kMaxEpollDepth) collect_connecting(*in, watch, quiet, depth + 1);
  }
}

}  // namespace

void connecting_natives(EpollSet& set, std::vector<pollfd>& watch, const std::vector<int>& quiet) {
  if (g_connecting_clients.load(std::memory_order_relaxed) <= 0) return;  // none anywhere: no lookups
  collect_connecting(set, watch, quiet, 1);
}

void connecting_in_set(int fd, std::vector<pollfd>& watch, const std::vector<int>& quiet) {
  if (g_connecting_clients.load(std::memory_order_relaxed) <= 0 || fd < 0) return;
  Ref e = table().get(fd);
  if (e && e->kind.load(std::memory_order_relaxed) == Entry::Kind::kEpoll && e->epoll) {
    connecting_natives(*e->epoll, watch, quiet);
  }
}

bool watches_connect(int fd) {
  if (g_connecting_clients.load(std::memory_order_relaxed) <= 0) return false;
  if (connecting_client(fd)) return true;
  std::vector<pollfd> held;
  connecting_in_set(fd, held, {});
  return !held.empty();
}

int sleep_with_connects(int epfd, std::vector<pollfd>& watch, int64_t dl, const sigset_t* mask,
                        std::vector<int>& quiet) {
  watch.insert(watch.begin(), pollfd{epfd, POLLIN, 0});
  int r;
  if (mask) {  // the program's signal mask, atomically, as its epoll_pwait would
    timespec t = ts_left(dl);
    r = real().ppoll(watch.data(), watch.size(), dl == kForever ? nullptr : &t, mask);
  } else {  // poll, which the epoll emulation uses already (a sandbox allows it)
    r = real().poll(watch.data(), watch.size(), ms_left(dl));
  }
  if (r <= 0) return r;
  int saved = errno;
  for (size_t i = 1; i < watch.size(); ++i) {
    // Still connecting after the kernel said it is done: look no more (no spinning).
    if (watch[i].revents && !settle_connecting(watch[i].fd)) quiet.push_back(watch[i].fd);
  }
  errno = saved;
  return 0;
}

// A TCP socket that is not connected (yet): it may become a stream later.
bool may_become_stream(int fd) {
  Ref e = table().get(fd);
  if (e) return e->kind.load() == Entry::Kind::kPending;
  int type = 0, domain = 0;
  socklen_t len = sizeof type;
  if (real().getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  len = sizeof domain;
  if (real().getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) return false;
  if (domain != AF_INET && domain != AF_INET6) return false;
  sockaddr_storage peer{};
  len = sizeof peer;
  return real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 && errno == ENOTCONN;
}

}  // namespace rdmashim::preload
