// rdmashim's transports used directly, without the preload: what the tools
// (rdmaPingPong, rdma_send, rdma_recv) build on. A Stream is a TCP connection
// that is upgraded when the other end runs rdmashim and stays plain TCP
// otherwise; the handshake completes inside connect() and accept(), so the
// first byte already takes the fast path.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "discovery/remote.h"
#include "util/stats.h"
#include "util/unique_fd.h"

namespace rdmashim {

class Connection;

class Stream {
 public:
  Stream();
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;
  ~Stream();

  // Connects to host:port (a name or a numeric address). *err is a negative
  // errno (or a getaddrinfo failure mapped to -EHOSTUNREACH) on failure.
  static Stream connect(const char* host, uint16_t port, int* err);

  explicit operator bool() const { return static_cast<bool>(fd_); }
  // Same semantics as the socket calls: a count, 0 at EOF, -errno on error.
  ssize_t send(const void* buf, size_t len);
  ssize_t recv(void* buf, size_t len);
  // Loops until all of len moved; returns len, or what moved before EOF/error.
  ssize_t send_all(const void* buf, size_t len);
  ssize_t recv_all(void* buf, size_t len);
  int shutdown_write();
  // "shm", "verbs" or "tcp:<reason>".
  const char* transport() const;
  int fd() const { return fd_.get(); }

 private:
  friend class Listener;
  Stream(UniqueFd fd, std::unique_ptr<Connection> conn,
         stats::Outcome plain_reason = stats::Outcome::kTcpNotAdvertised);
  UniqueFd fd_;
  std::unique_ptr<Connection> conn_;
  stats::Outcome plain_reason_ = stats::Outcome::kTcpNotAdvertised;  // why, without conn_
};

class Listener {
 public:
  Listener();
  Listener(Listener&&) noexcept;
  Listener& operator=(Listener&&) noexcept;
  ~Listener();

  // Listens on host:port (port 0 picks a free one) and advertises it to
  // rdmashim clients on this host and, over RDMA-CM, on others.
  static Listener listen(const char* host, uint16_t port, int* err);
  explicit operator bool() const { return static_cast<bool>(fd_); }
  Stream accept(int* err);
  uint16_t port() const;
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  UniqueFd advert_;
  std::unique_ptr<discovery::RemoteAdvert> remote_advert_;
};

}  // namespace rdmashim
