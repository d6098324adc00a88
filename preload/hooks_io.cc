// Hooks for moving bytes (splice and sendfile: hooks_splice.cc). Untracked descriptors (files, pipes, plain
// sockets) cost one table load and go straight to the kernel; tracked ones
// go through their Connection, which speaks TCP, frames or the ring.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>

#include "preload.h"
#include "util/iov.h"

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

using sys::Calls;

ssize_t stream_recv(Connection& c, void* buf, size_t len, int flags, Calls calls) {
  iovec iov{buf, len};
  return syscall_result(c.recv(&iov, 1, flags, calls));
}

ssize_t stream_send(Connection& c, const void* buf, size_t len, int flags, Calls calls) {
  iovec iov{const_cast<void*>(buf), len};
  return syscall_result(c.send(&iov, 1, flags, calls));
}

bool bad_iovcnt(int n) { return n < 0 || n > IOV_MAX; }

}  // namespace

extern "C" {

ssize_t read(int fd, void* buf, size_t len) {
  if (Ref s = active_stream(fd)) {
    if (len == 0) return 0;  // read(2) of nothing returns at once; recv(2) would wait
    return stream_recv(*s->conn, buf, len, 0, Calls::kRead);
  }
  return real().read(fd, buf, len);
}

ssize_t write(int fd, const void* buf, size_t len) {
  if (Ref s = active_stream(fd)) return stream_send(*s->conn, buf, len, 0, Calls::kRead);
  return real().write(fd, buf, len);
}

ssize_t recv(int fd, void* buf, size_t len, int flags) {
  if (Ref s = active_stream(fd)) return stream_recv(*s->conn, buf, len, flags, Calls::kSend);
  return real().recv(fd, buf, len, flags);
}

ssize_t send(int fd, const void* buf, size_t len, int flags) {
  if (Ref s = active_stream(fd)) return stream_send(*s->conn, buf, len, flags, Calls::kSend);
  return real().send(fd, buf, len, flags);
}

ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* addr, socklen_t* addrlen) {
  if (Ref s = active_stream(fd)) {
    // A connected TCP socket reports no source address.
    if (addr && addrlen) *addrlen = 0;
    return stream_recv(*s->conn, buf, len, flags, Calls::kSend);
  }
  return real().recvfrom(fd, buf, len, flags, addr, addrlen);
}

ssize_t sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* addr, socklen_t addrlen) {
  // TCP ignores the destination of a connected socket.
  if (Ref s = active_stream(fd)) return stream_send(*s->conn, buf, len, flags, Calls::kSend);
  return real().sendto(fd, buf, len, flags, addr, addrlen);
}

ssize_t readv(int fd, const iovec* iov, int n) {
  if (Ref s = active_stream(fd)) {
    if (bad_iovcnt(n)) return syscall_result<ssize_t>(-EINVAL);
    if (rdmashim::iov_total(iov, n) == 0) return 0;  // as read(2)
    return syscall_result(s->conn->recv(iov, n, 0, Calls::kReadv));
  }
  return real().readv(fd, iov, n);
}

ssize_t writev(int fd, const iovec* iov, int n) {
  if (Ref s = active_stream(fd)) {
    if (bad_iovcnt(n)) return syscall_result<ssize_t>(-EINVAL);
    return syscall_result(s->conn->send(iov, n, 0, Calls::kReadv));
  }
  return real().writev(fd, iov, n);
}

ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  if (Ref s = active_stream(fd)) {
    if (bad_iovcnt(static_cast<int>(msg->msg_iovlen))) return syscall_result<ssize_t>(-EMSGSIZE);
    ssize_t r = s->conn->recv(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags, Calls::kMsg);
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
    return syscall_result(s->conn->send(msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags, Calls::kMsg));
  }
  return real().sendmsg(fd, msg, flags);
}

int recvmmsg(int fd, mmsghdr* vec, unsigned int vlen, int flags, timespec* timeout) {
  Ref s = active_stream(fd);
  if (!s) return real().recvmmsg(fd, vec, vlen, flags, timeout);
  // A stream has no message boundaries: each entry takes what one recvmsg
  // would. MSG_WAITFORONE makes every call after the first non-blocking.
  unsigned int n = 0;
  for (; n < vlen; ++n) {
    int f = flags & ~MSG_WAITFORONE;
    if (n > 0 && (flags & MSG_WAITFORONE)) f |= MSG_DONTWAIT;
    msghdr& m = vec[n].msg_hdr;
    ssize_t r = s->conn->recv(m.msg_iov, static_cast<int>(m.msg_iovlen), f);
    if (r < 0) {
      if (n == 0) return static_cast<int>(syscall_result(r));
      break;
    }
    vec[n].msg_len = static_cast<unsigned int>(r);
    m.msg_namelen = 0;
    m.msg_controllen = 0;
    m.msg_flags = 0;
    if (r == 0) {
      ++n;
      break;  // end of stream
    }
  }
  return static_cast<int>(n);
}

int sendmmsg(int fd, mmsghdr* vec, unsigned int vlen, int flags) {
  Ref s = active_stream(fd);
  if (!s) return real().sendmmsg(fd, vec, vlen, flags);
  unsigned int n = 0;
  for (; n < vlen; ++n) {
    msghdr& m = vec[n].msg_hdr;
    ssize_t r = s->conn->send(m.msg_iov, static_cast<int>(m.msg_iovlen), flags);
    if (r < 0) {
      if (n == 0) return static_cast<int>(syscall_result(r));
      break;
    }
    vec[n].msg_len = static_cast<unsigned int>(r);
  }
  return static_cast<int>(n);
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
