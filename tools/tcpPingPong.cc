// tcpPingPong: a plain-sockets ping-pong. Nothing rdmashim-specific in it:
// run it as it is for the TCP baseline, and under `rdmashim run` to measure
// what the preload does for an unmodified program.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "pingpong.h"

using rdmashim::tools::Channel;
using rdmashim::tools::PingPongOptions;

namespace {

const char* kTool = "tcpPingPong";

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

Channel socket_channel(int fd, const std::string& mode = "block") {
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
  ch.transport = "tcp";
  return ch;
}

void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int open_listener(const PingPongOptions& o, uint16_t* port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  std::string service = std::to_string(o.port);
  const char* host = o.mode == PingPongOptions::Mode::kServer && o.host == "127.0.0.1" ? nullptr : o.host.c_str();
  if (getaddrinfo(host, service.c_str(), &hints, &res) != 0) return -1;
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 16) != 0) {
    perror("tcpPingPong: listen");
    freeaddrinfo(res);
    return -1;
  }
  freeaddrinfo(res);
  sockaddr_storage self{};
  socklen_t len = sizeof self;
  getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len);
  *port = ntohs(self.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&self)->sin_port
                                          : reinterpret_cast<sockaddr_in6*>(&self)->sin6_port);
  return fd;
}

int serve(int listener, const PingPongOptions& o, bool once) {
  do {
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR) continue;
      perror("tcpPingPong: accept");
      return 1;
    }
    nodelay(fd);
    Channel ch = socket_channel(fd, o.wait);
    int r = rdmashim::tools::serve_pingpong(ch, o.size);
    if (r < 0) fprintf(stderr, "%s: connection ended: %s\n", kTool, strerror(-r));
    close(fd);
  } while (!once);
  return 0;
}

int connect_to(const std::string& host, uint16_t port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0) {
    fprintf(stderr, "%s: cannot resolve %s\n", kTool, host.c_str());
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) fprintf(stderr, "%s: cannot connect to %s:%u: %s\n", kTool, host.c_str(), port, strerror(errno));
  else nodelay(fd);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  PingPongOptions o;
  if (!rdmashim::tools::parse_pingpong_args(kTool, argc, argv, &o, false)) return 2;
  if (o.mode == PingPongOptions::Mode::kServer) {
    uint16_t port = 0;
    int l = open_listener(o, &port);
    if (l < 0) return 1;
    fprintf(stderr, "%s: serving on port %u\n", kTool, port);
    return serve(l, o, false);
  }
  if (o.mode == PingPongOptions::Mode::kLocal) {
    o.host = "127.0.0.1";
    uint16_t port = 0;
    int l = open_listener(o, &port);
    if (l < 0) return 1;
    pid_t child = fork();
    if (child < 0) {
      perror("tcpPingPong: fork");
      return 1;
    }
    if (child == 0) _exit(serve(l, o, true));
    close(l);
    o.port = port;
    int fd = connect_to(o.host, o.port);
    int rc = 1;
    if (fd >= 0) {
      Channel ch = socket_channel(fd, o.wait);
      rc = rdmashim::tools::run_pingpong_client(kTool, ch, o);
      close(fd);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  int fd = connect_to(o.host, o.port);
  if (fd < 0) return 1;
  Channel ch = socket_channel(fd, o.wait);
  int rc = rdmashim::tools::run_pingpong_client(kTool, ch, o);
  close(fd);
  return rc;
}
