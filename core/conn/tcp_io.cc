// The calls on the TCP socket itself, made in the program's calling
// convention (sys/calls.h): data while a direction is raw or framed, and
// rdmashim's control frames. read/write programs get read()/write() (a
// non-blocking attempt on a blocking socket asks the program's sleeping call
// with a zero timeout first), recv/send programs recv()/send(),
// recvmsg/sendmsg programs recvmsg()/sendmsg(). Only what a family cannot
// express (MSG_PEEK, MSG_OOB, MSG_WAITALL, MSG_TRUNC on read/write) takes
// recvmsg/sendmsg, as before: the handshake and the close-time drain.
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "conn/connection.h"
#include "sys/calls.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/misc.h"

namespace rdmashim {
namespace {

// The first buffer with bytes in it (or the first one): single-buffer calls
// move that much; callers loop on short counts anyway.
const iovec& first_buffer(const iovec* iov, int n) {
  for (int i = 0; i < n; ++i)
    if (iov[i].iov_len > 0) return iov[i];
  return iov[0];
}

ssize_t result(ssize_t r) { return r < 0 ? -errno : r; }

// Without waiting: is fd ready for `events` (or in error)? 1, 0, or -errno.
int ready_now(int fd, short events) {
  pollfd p{fd, events, 0};
  int r = sys::wait(&p, 1, 0);
  if (r < 0) return -errno;
  return r > 0 && p.revents != 0 ? 1 : 0;
}

}  // namespace

ssize_t Connection::tcp_recv(const iovec* iov, int n, int flags) {
  const sys::Table& k = sys::real();
  int fd = fd_.load(std::memory_order_relaxed);
  sys::Calls calls = sys::current_calls();
  if (sys::file_calls(calls) && (flags & ~MSG_DONTWAIT) == 0) {
    if ((flags & MSG_DONTWAIT) && !nonblocking(0)) {
      int r = ready_now(fd, POLLIN);
      if (r <= 0) return r == 0 ? -EAGAIN : r;
    }
    if (calls == sys::Calls::kReadv && n > 1) return result(k.readv(fd, iov, n));
    const iovec& b = first_buffer(iov, n);
    return result(k.read(fd, b.iov_base, b.iov_len));
  }
  if (calls == sys::Calls::kSend || (sys::file_calls(calls) && n <= 1)) {
    const iovec& b = first_buffer(iov, n);
    return result(k.recv(fd, b.iov_base, b.iov_len, flags));
  }
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = static_cast<size_t>(n);
  return result(k.recvmsg(fd, &m, flags));
}

ssize_t Connection::tcp_send(const iovec* iov, int n, int flags) {
  const sys::Table& k = sys::real();
  int fd = fd_.load(std::memory_order_relaxed);
  sys::Calls calls = sys::current_calls();
  if (sys::file_calls(calls) && (flags & ~(MSG_DONTWAIT | MSG_NOSIGNAL)) == 0) {
    bool dontwait = (flags & MSG_DONTWAIT) && !nonblocking(0);
    // write() raises SIGPIPE on a broken stream. Where the program's own call
    // would not have (a read, a shutdown, a close), look first: a socket in
    // error or hung up gets no write. (An RST landing in between still
    // raises it; that window is the price of not calling send().)
    bool guard = (flags & MSG_NOSIGNAL) && !sys::sigpipe_ok();
    if (dontwait || guard) {
      pollfd p{fd, POLLOUT, 0};
      int r = sys::wait(&p, 1, 0);
      if (r < 0) return -errno;
      if (guard && (p.revents & (POLLERR | POLLHUP))) return -EPIPE;
      if (dontwait && r == 0) return -EAGAIN;
    }
    ssize_t r;
    if (calls == sys::Calls::kReadv && n > 1) {
      r = k.writev(fd, iov, n);
    } else {
      const iovec& b = first_buffer(iov, n);
      r = k.write(fd, b.iov_base, b.iov_len);
    }
    if (r < 0 && errno == EPIPE) sys::note_sigpipe_raised();
    return result(r);
  }
  if (calls == sys::Calls::kSend || (sys::file_calls(calls) && n <= 1)) {
    const iovec& b = first_buffer(iov, n);
    ssize_t r = k.send(fd, b.iov_base, b.iov_len, flags);
    if (r < 0 && errno == EPIPE && !(flags & MSG_NOSIGNAL)) sys::note_sigpipe_raised();
    return result(r);
  }
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = static_cast<size_t>(n);
  ssize_t r = k.sendmsg(fd, &m, flags);
  if (r < 0 && errno == EPIPE && !(flags & MSG_NOSIGNAL)) sys::note_sigpipe_raised();
  return result(r);
}

// Control frames: not a byte yet may be retried later (-EAGAIN); once the
// first byte left, the rest follows, waiting for room up to the setup timeout.
int Connection::send_control_bytes(const void* buf, size_t len, int more) {
  const auto* p = static_cast<const char*>(buf);
  uint64_t give_up = 0;
  size_t done = 0;
  while (done < len) {
    iovec v{const_cast<char*>(p + done), len - done};
    ssize_t n = tcp_send(&v, 1, MSG_NOSIGNAL | MSG_DONTWAIT | more);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n != -EAGAIN && n != -EWOULDBLOCK && n != -EINTR) return n < 0 ? static_cast<int>(n) : -EIO;
    if (done == 0) return -EAGAIN;
    uint64_t now = now_ns();
    if (!give_up) give_up = now + uint64_t{config().setup_timeout_ms} * 1'000'000;
    if (now >= give_up) return -ETIMEDOUT;
    pollfd w{fd(), POLLOUT, 0};
    sys::wait(&w, 1, static_cast<int>((give_up - now) / 1'000'000) + 1);
  }
  return 0;
}

// EPIPE for the application, with the SIGPIPE its call would have drawn. The
// kernel raises it for a call of the program's own family that finds the
// stream broken, even of zero bytes; only if the socket itself is not (yet)
// broken is it raised by hand.
int Connection::epipe(int flags) {
  if (flags & MSG_NOSIGNAL) return -EPIPE;
  if (sys::sigpipe_raised()) return -EPIPE;  // our own write already drew it
  char none = 0;
  iovec v{&none, 0};
  if (tcp_send(&v, 1, 0) == -EPIPE) return -EPIPE;
  pthread_kill(pthread_self(), SIGPIPE);
  return -EPIPE;
}

}  // namespace rdmashim
