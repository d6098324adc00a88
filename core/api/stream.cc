#include "api/stream.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>

#include "conn/connection.h"
#include "discovery/registry.h"
#include "discovery/remote.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/process.h"
#include "util/stats.h"

namespace rdmashim {
namespace {

int resolve(const char* host, uint16_t port, bool passive, addrinfo** out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  char service[8];
  snprintf(service, sizeof service, "%u", port);
  return getaddrinfo(host && *host ? host : nullptr, service, &hints, out) == 0 ? 0 : -EHOSTUNREACH;
}

void set_nodelay(int fd) {
  int one = 1;
  sys::real().setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

Stream::Stream() = default;
Stream::Stream(Stream&&) noexcept = default;
Stream& Stream::operator=(Stream&&) noexcept = default;
Stream::~Stream() = default;
Stream::Stream(UniqueFd fd, std::unique_ptr<Connection> conn, stats::Outcome plain_reason)
    : fd_(std::move(fd)), conn_(std::move(conn)), plain_reason_(plain_reason) {}

Stream Stream::connect(const char* host, uint16_t port, int* err) {
  addrinfo* list = nullptr;
  *err = resolve(host, port, false, &list);
  if (*err) return Stream();
  const auto& sys = sys::real();
  *err = -ECONNREFUSED;
  for (addrinfo* a = list; a; a = a->ai_next) {
    UniqueFd fd(sys.socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) {
      *err = -errno;
      continue;
    }
    if (sys.connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      *err = -errno;
      continue;
    }
    set_nodelay(fd.get());
    std::unique_ptr<Connection> conn;
    stats::Outcome why = stats::Outcome::kTcpNotAdvertised;
    if (discovery::is_rdmashim_peer(a->ai_addr, a->ai_addrlen)) {
      conn = Connection::make_client(fd.get());
      if (conn) conn->finish_setup(static_cast<int>(config().setup_timeout_ms));
      else why = upgrades_allowed() ? stats::Outcome::kTcpSetupFailed : stats::Outcome::kTcpPolicy;
    } else {
      if (discovery::remote_refusal(a->ai_addr, a->ai_addrlen)) why = stats::Outcome::kTcpPolicy;
      stats::count(why);
    }
    freeaddrinfo(list);
    *err = 0;
    return Stream(std::move(fd), std::move(conn), why);
  }
  freeaddrinfo(list);
  return Stream();
}

ssize_t Stream::send(const void* buf, size_t len) {
  if (conn_) {
    iovec iov{const_cast<void*>(buf), len};
    return conn_->send(&iov, 1, MSG_NOSIGNAL);
  }
  ssize_t n = sys::real().send(fd_.get(), buf, len, MSG_NOSIGNAL);
  return n < 0 ? -errno : n;
}

ssize_t Stream::recv(void* buf, size_t len) {
  if (conn_) {
    iovec iov{buf, len};
    return conn_->recv(&iov, 1, 0);
  }
  ssize_t n = sys::real().recv(fd_.get(), buf, len, 0);
  return n < 0 ? -errno : n;
}

ssize_t Stream::send_all(const void* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = send(static_cast<const char*>(buf) + done, len - done);
    if (n == -EINTR) continue;
    if (n <= 0) return done > 0 ? static_cast<ssize_t>(done) : n;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

ssize_t Stream::recv_all(void* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(static_cast<char*>(buf) + done, len - done);
    if (n == -EINTR) continue;
    if (n <= 0) return done > 0 ? static_cast<ssize_t>(done) : n;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

int Stream::shutdown_write() {
  if (conn_) return conn_->shutdown(SHUT_WR);
  return sys::real().shutdown(fd_.get(), SHUT_WR) == 0 ? 0 : -errno;
}

const char* Stream::transport() const {
  return conn_ ? conn_->transport_name() : stats::name(plain_reason_);
}

Listener::Listener() = default;
Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

Listener Listener::listen(const char* host, uint16_t port, int* err) {
  addrinfo* list = nullptr;
  *err = resolve(host, port, true, &list);
  if (*err) return Listener();
  const auto& sys = sys::real();
  Listener l;
  *err = -EADDRNOTAVAIL;
  for (addrinfo* a = list; a && !l.fd_; a = a->ai_next) {
    UniqueFd fd(sys.socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    if (!fd || sys.setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        sys.bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || sys.listen(fd.get(), 128) != 0) {
      *err = -errno;
      continue;
    }
    sockaddr_storage self{};
    socklen_t len = sizeof self;
    sys.getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &len);
    l.advert_ = discovery::advertise(reinterpret_cast<sockaddr*>(&self), len);
    l.remote_advert_ = discovery::advertise_remote(reinterpret_cast<sockaddr*>(&self), len);
    l.fd_ = std::move(fd);
    *err = 0;
  }
  freeaddrinfo(list);
  return l;
}

Stream Listener::accept(int* err) {
  int fd = sys::real().accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    *err = -errno;
    return Stream();
  }
  set_nodelay(fd);
  std::unique_ptr<Connection> conn = Connection::make_server(fd);
  if (conn) conn->finish_setup(static_cast<int>(config().setup_timeout_ms));
  *err = 0;
  return Stream(UniqueFd(fd), std::move(conn));
}

uint16_t Listener::port() const {
  sockaddr_storage self{};
  socklen_t len = sizeof self;
  if (sys::real().getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&self), &len) != 0) return 0;
  if (self.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&self)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&self)->sin6_port);
}

}  // namespace rdmashim
