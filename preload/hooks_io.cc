// Hooks for moving bytes. Untracked descriptors (files, pipes, plain
// sockets) cost one table load and go straight to the kernel; tracked ones
// go through their Connection, which speaks TCP, frames or the ring.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>

#include "preload.h"

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

ssize_t stream_recv(Connection& c, void* buf, size_t len, int flags) {
  iovec iov{buf, len};
  return syscall_result(c.recv(&iov, 1, flags));
}

ssize_t stream_send(Connection& c, const void* buf, size_t len, int flags) {
  iovec iov{const_cast<void*>(buf), len};
  return syscall_result(c.send(&iov, 1, flags));
}

bool bad_iovcnt(int n) { return n < 0 || n > IOV_MAX; }

}  // namespace

extern "C" {

ssize_t read(int fd, void* buf, size_t len) {
  if (Ref s = active_stream(fd)) return stream_recv(*s->conn, buf, len, 0);
  return real().read(fd, buf, len);
}

ssize_t write(int fd, const void* buf, size_t len) {
  if (Ref s = active_stream(fd)) return stream_send(*s->conn, buf, len, 0);
  return real().write(fd, buf, len);
}

ssize_t recv(int fd, void* buf, size_t len, int flags) {
  if (Ref s = active_stream(fd)) return stream_recv(*s->conn, buf, len, flags);
  return real().recv(fd, buf, len, flags);
}

ssize_t send(int fd, const void* buf, size_t len, int flags) {
  if (Ref s = active_stream(fd)) return stream_send(*s->conn, buf, len, flags);
  return real().send(fd, buf, len, flags);
}

ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* addr, socklen_t* addrlen) {
  if (Ref s = active_stream(fd)) {
    // A connected TCP socket reports no source address.
    if (addr && addrlen) *addrlen = 0;
    return stream_recv(*s->conn, buf, len, flags);
  }
  return real().recvfrom(fd, buf, len, flags, addr, addrlen);
}

ssize_t sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* addr, socklen_t addrlen) {
  // TCP ignores the destination of a connected socket.
  if (Ref s = active_stream(fd)) return stream_send(*s->conn, buf, len, flags);
  return real().sendto(fd, buf, len, flags, addr, addrlen);
}

ssize_t readv(int fd, const iovec* iov, int n) {
  if (Ref s = active_stream(fd)) {
    if (bad_iovcnt(n)) return syscall_result<ssize_t>(-EINVAL);
    return syscall_result(s->conn->recv(iov, n, 0));
  }
  return real().readv(fd, iov, n);
}

ssize_t writev(int fd, const iovec* iov, int n) {
  if (Ref s = active_stream(fd)) {
    if (bad_iovcnt(n)) return syscall_result<ssize_t>(-EINVAL);
    return syscall_result(s->conn->send(iov, n, 0));
  }
  return real().writev(fd, iov, n);
}

ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  if (Ref s = active_stream(fd)) {
    if (bad_iovcnt(static_cast<int>(msg->msg_iovlen))) return syscall_result<ssize_t>(-EMSGSIZE);
    ssize_t r = s->conn->recv(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
    if (r >= 0) {
      msg->msg_namelen = 0;
      msg->msg_controllen = 0;
      msg->msg_flags = 0;
    }
    return syscall_result(r);
  }
  return real().recvmsg(fd, msg, flags);
}

ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  if (Ref s = active_stream(fd)) {
    if (bad_iovcnt(static_cast<int>(msg->msg_iovlen))) return syscall_result<ssize_t>(-EMSGSIZE);
    return syscall_result(s->conn->send(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags));
  }
  return real().sendmsg(fd, msg, flags);
}

// _FORTIFY_SOURCE builds (Debian's packages among them) call these instead;
// glibc's own versions would reach the kernel without passing our hooks.
ssize_t __read_chk(int fd, void* buf, size_t len, size_t buflen) {
  if (len > buflen) abort();  // what glibc's __chk_fail does, minus the message
  return read(fd, buf, len);
}

ssize_t __recv_chk(int fd, void* buf, size_t len, size_t buflen, int flags) {
  if (len > buflen) abort();
  return recv(fd, buf, len, flags);
}

ssize_t __recvfrom_chk(int fd, void* buf, size_t len, size_t buflen, int flags, sockaddr* addr,
                       socklen_t* addrlen) {
  if (len > buflen) abort();
  return recvfrom(fd, buf, len, flags, addr, addrlen);
}

}  // extern "C"
