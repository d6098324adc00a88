#include "tcp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>

namespace rdmashim::tools {
namespace {

// How a side waits for its socket: blocking calls, or a non-blocking socket
// and poll()/epoll_wait() before each try, as event-loop servers do.
struct Waiter {
  std::string mode;
  int fd;
  int ep = -1;
  Waiter(const std::string& m, int f) : mode(m), fd(f) {
    if (mode == "block") return;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (mode == "epoll") {
      ep = epoll_create1(EPOLL_CLOEXEC);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = 0x5eed;
      epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
  }
  // Returns false on an error from the wait itself.
  bool wait(short events) {
    if (mode == "poll") {
      pollfd p{fd, events, 0};
      return poll(&p, 1, -1) >= 0 || errno == EINTR;
    }
    if (mode == "epoll") {
      epoll_event ev{};
      ev.events = events == POLLIN ? EPOLLIN : EPOLLOUT;
      ev.data.u64 = 0x5eed;
      epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
      epoll_event got{};
      int n = epoll_wait(ep, &got, 1, -1);
      return n >= 0 || errno == EINTR;
    }
    return true;
  }
};

// --unix: every listen/connect of this process uses this abstract Unix
// socket name instead of host:port (empty: TCP).
std::string g_unix_name;

int unix_socket(const char* tool, bool listening) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  size_t n = std::min(g_unix_name.size(), sizeof a.sun_path - 2);
  memcpy(a.sun_path + 1, g_unix_name.data(), n);  // abstract: leading NUL
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && (listening ? bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0 && listen(fd, 128) == 0
                                  : connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0);
  if (!ok) {
    fprintf(stderr, "%s: unix socket @%s: %s\n", tool, g_unix_name.c_str(), strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

void use_unix_sockets(const std::string& name) { g_unix_name = name; }

Channel tcp_channel(int fd, const std::string& mode) {
  auto w = std::make_shared<Waiter>(mode, fd);
  Channel ch;
  ch.recv_all = [fd, w](void* buf, size_t len) -> ssize_t {
    size_t done = 0;
    while (done < len) {
      ssize_t n = recv(fd, static_cast<char*>(buf) + done, len - done, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!w->wait(POLLIN)) return -errno;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return done > 0 ? static_cast<ssize_t>(done) : (n == 0 ? 0 : -errno);
      done += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(done);
  };
  ch.send_all = [fd, w](const void* buf, size_t len) -> ssize_t {
    size_t done = 0;
    while (done < len) {
      ssize_t n = send(fd, static_cast<const char*>(buf) + done, len - done, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!w->wait(POLLOUT)) return -errno;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return -errno;
      done += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(done);
  };
  ch.transport = g_unix_name.empty() ? "tcp" : "unix";
  return ch;
}

void tcp_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int tcp_listen(const char* tool, const char* host, uint16_t port, uint16_t* bound) {
  if (!g_unix_name.empty()) {
    *bound = 1;
    return unix_socket(tool, true);
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  std::string service = std::to_string(port);
  if (getaddrinfo(host, service.c_str(), &hints, &res) != 0) return -1;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    fprintf(stderr, "%s: listen: %s\n", tool, strerror(errno));
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    return -1;
  }
  freeaddrinfo(res);
  sockaddr_storage self{};
  socklen_t len = sizeof self;
  getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len);
  *bound = ntohs(self.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&self)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&self)->sin6_port);
  return fd;
}

int tcp_connect(const char* tool, const std::string& host, uint16_t port) {
  if (!g_unix_name.empty()) return unix_socket(tool, false);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0) {
    fprintf(stderr, "%s: cannot resolve %s\n", tool, host.c_str());
    return -1;
  }
  int fd = -1, err = 0;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = errno;
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) fprintf(stderr, "%s: cannot connect to %s:%u: %s\n", tool, host.c_str(), port, strerror(err));
  else tcp_nodelay(fd);
  return fd;
}

}  // namespace rdmashim::tools
