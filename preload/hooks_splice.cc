// splice() and sendfile() with an rdmashim stream on one side. The kernel's
// would move bytes past the ring (and past the framing before the switch),
// so they are emulated with the kernel's semantics (fs/splice.c; checked
// against TCP sockets on Linux 6.x, see tests/diff/sc_splice.cc):
//  - the pipe side blocks unless SPLICE_F_NONBLOCK or the pipe's O_NONBLOCK;
//    the socket side unless the socket's O_NONBLOCK (SPLICE_F_NONBLOCK does
//    not reach a TCP socket), within SO_RCVTIMEO / SO_SNDTIMEO;
//  - socket -> pipe waits for room in the pipe first, then for data;
//    pipe -> socket waits for data in the pipe first, then for room;
//  - nothing leaves one side that the other did not take. Stream bytes are
//    peeked and put into the pipe by the kernel itself (through a private
//    pipe and a non-blocking splice, so the pipe's own slot accounting
//    decides how much fits); pipe bytes are copied with tee() and consumed
//    only once the stream took them; sendfile reads the file with pread and
//    moves the position by what the stream took.
// Under a seccomp filter (sys/calls.h) the calls made here are splice's own
// (splice, tee, a private pipe), the program's way of sleeping, and on the
// socket the family the program last used there.
// tee, vmsplice and copy_file_range need no hook: on a socket the kernel
// refuses them (EINVAL, EBADF) exactly as it would without us.
#include <fcntl.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>

#include "preload.h"
#include "sys/calls.h"
#include "util/signals.h"

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

constexpr unsigned kSpliceFlags = SPLICE_F_MOVE | SPLICE_F_NONBLOCK | SPLICE_F_MORE | SPLICE_F_GIFT;
constexpr size_t kMaxRw = INT_MAX & ~size_t{4095};  // the kernel's MAX_RW_COUNT
constexpr size_t kChunk = 64 * 1024;

ssize_t fail(int e) {
  errno = e;
  return -1;
}

size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

bool file_type(int fd, mode_t type) {
  struct stat st;
  return fstat(fd, &st) == 0 && (st.st_mode & S_IFMT) == type;
}
bool readable(int fl) { return (fl & O_ACCMODE) != O_WRONLY && (fl & O_PATH) == 0; }
bool writable(int fl) { return (fl & O_ACCMODE) != O_RDONLY && (fl & O_PATH) == 0; }

// A pipe of our own for one call, closed with it: nothing of ours outlives it.
struct PrivatePipe {
  int fd[2] = {-1, -1};
  bool open(int flags) { return pipe2(fd, O_CLOEXEC | flags) == 0; }
  void drain() {
    char junk[4096];
    while (real().read(fd[0], junk, sizeof junk) > 0) {
    }
  }
  ~PrivatePipe() {
    for (int f : fd)
      if (f >= 0) real().close(f);
  }
};

// Puts bytes peeked from the stream into the application's pipe, never
// blocking: the kernel moves whole pipe buffers only while slots are free.
struct PipeSink {
  int pipe;
  unsigned flags;
  PrivatePipe priv;  // non-blocking, empty between calls
  bool refused = false;
};

ssize_t into_pipe(void* ctx, const void* buf, size_t n) {
  auto* s = static_cast<PipeSink*>(ctx);
  ssize_t w = real().write(s->priv.fd[1], buf, n);
  if (w <= 0) return w < 0 ? -errno : -EAGAIN;
  ssize_t m = real().splice(s->priv.fd[0], nullptr, s->pipe, nullptr, static_cast<size_t>(w),
                            SPLICE_F_NONBLOCK | (s->flags & SPLICE_F_MORE));
  int e = errno;
  if (m < w) s->priv.drain();  // not taken: stays in the stream
  if (m < 0) {
    s->refused = e == EAGAIN;
    return -e;
  }
  return m;
}

// A pipe without readers: the kernel's EPIPE and SIGPIPE, from the kernel.
ssize_t pipe_broken(PipeSink& s) {
  char one = 0;
  if (real().write(s.priv.fd[1], &one, 1) == 1) {
    ssize_t r = real().splice(s.priv.fd[0], nullptr, s.pipe, nullptr, 1, SPLICE_F_NONBLOCK);
    int e = errno;
    s.priv.drain();
    if (r < 0) return fail(e);
  }
  return fail(EPIPE);
}

ssize_t stream_to_pipe(Connection& c, int pipe, size_t len, unsigned flags, bool pipe_nonblock) {
  PipeSink sink{pipe, flags, {}, false};
  if (!sink.priv.open(O_NONBLOCK)) return -1;
  for (;;) {
    // The kernel waits for room in the pipe before it looks at the socket.
    pollfd p{pipe, POLLOUT, 0};
    int r = sys::wait(&p, 1, pipe_nonblock ? 0 : -1);  // the program's own way of sleeping
    if (r < 0) {
      if (errno == EINTR && signals_restart()) continue;
      return -1;
    }
    if (p.revents & POLLERR) return pipe_broken(sink);
    if (!(p.revents & POLLOUT)) return fail(EAGAIN);
    sink.refused = false;
    ssize_t n = c.recv_to(len, 0, into_pipe, &sink);
    // Another writer filled the pipe while we waited for data: wait again.
    if (n == -EAGAIN && sink.refused && !pipe_nonblock) continue;
    return syscall_result(n);
  }
}

// Reads exactly n bytes that are known to be in the pipe.
void take_from_pipe(int fd, char* buf, size_t n) {
  while (n > 0) {
    ssize_t r = real().read(fd, buf, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    n -= static_cast<size_t>(r);
  }
}

ssize_t pipe_to_stream(Connection& c, int pipe, size_t len, unsigned flags, bool pipe_nonblock) {
  PrivatePipe priv;  // blocking, so tee() waits as the caller's splice would
  if (!priv.open(0)) return -1;
  char buf[kChunk];
  size_t done = 0;
  while (done < len) {
    // tee() waits for data in the pipe (as the kernel's splice does first)
    // and copies it without consuming it.
    unsigned tf = pipe_nonblock || done > 0 ? SPLICE_F_NONBLOCK : 0;
    ssize_t n = tee(pipe, priv.fd[1], min_size(len - done, sizeof buf), tf);
    if (n <= 0) return done > 0 ? static_cast<ssize_t>(done) : n;
    take_from_pipe(priv.fd[0], buf, static_cast<size_t>(n));
    iovec iov{buf, static_cast<size_t>(n)};
    ssize_t sent = c.send(&iov, 1, (flags & SPLICE_F_MORE) ? MSG_MORE : 0, c.last_calls());
    if (sent <= 0) return done > 0 ? static_cast<ssize_t>(done) : syscall_result(sent);
    take_from_pipe(pipe, buf, static_cast<size_t>(sent));  // exactly what the stream took
    done += static_cast<size_t>(sent);
    if (sent < n) break;
  }
  return static_cast<ssize_t>(done);
}

// sendfile from a file into the stream: pread, so the position moves only by
// what the stream took.
ssize_t file_to_stream(Connection& c, int in_fd, off_t* offset, size_t count) {
  if (!file_type(in_fd, S_IFREG) && !file_type(in_fd, S_IFBLK)) return fail(EINVAL);
  off_t pos = offset ? *offset : lseek(in_fd, 0, SEEK_CUR);
  if (pos < 0) return offset ? fail(EINVAL) : -1;
  count = min_size(count, kMaxRw);
  char buf[kChunk];
  size_t done = 0;
  ssize_t err = 0;
  while (done < count) {
    ssize_t got = real().pread(in_fd, buf, min_size(count - done, sizeof buf), pos);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      err = got < 0 ? -errno : 0;
      break;
    }
    iovec iov{buf, static_cast<size_t>(got)};
    ssize_t sent = c.send(&iov, 1, 0, c.last_calls());
    if (sent < 0) {
      err = sent;
      break;
    }
    done += static_cast<size_t>(sent);
    pos += sent;
    if (sent < got) break;
  }
  if (done > 0) {
    if (offset) *offset = pos;
    else lseek(in_fd, pos, SEEK_SET);
  }
  if (done == 0 && err < 0) return syscall_result(err);
  return static_cast<ssize_t>(done);
}

}  // namespace

extern "C" {

ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  Ref out = active_stream(out_fd);
  Ref in = out ? Ref() : active_stream(in_fd);
  if (!out && !in) return real().sendfile(out_fd, in_fd, offset, count);
  // The kernel's order of checks (do_sendfile).
  int ifl = real().fcntl(in_fd, F_GETFL);
  if (ifl < 0 || !readable(ifl)) return fail(EBADF);
  if (offset && in) return fail(ESPIPE);  // a socket has no pread
  if (offset && *offset < 0) return fail(EINVAL);
  int ofl = real().fcntl(out_fd, F_GETFL);
  if (ofl < 0 || !writable(ofl)) return fail(EBADF);
  if (out) return file_to_stream(*out->conn, in_fd, offset, count);
  // From the stream: only into a pipe (elsewhere the kernel wants a file).
  if (!file_type(out_fd, S_IFIFO)) return fail(EINVAL);
  if (count == 0) return 0;
  return stream_to_pipe(*in->conn, out_fd, min_size(count, kMaxRw), 0, (ofl & O_NONBLOCK) != 0);
}

ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t count) {
  return sendfile(out_fd, in_fd, reinterpret_cast<off_t*>(offset), count);
}

ssize_t splice(int fd_in, loff_t* off_in, int fd_out, loff_t* off_out, size_t len, unsigned int flags) {
  Ref in = active_stream(fd_in);
  Ref out = in ? Ref() : active_stream(fd_out);
  if (!in && !out) return real().splice(fd_in, off_in, fd_out, off_out, len, flags);
  // The kernel's order of checks (the syscall, __do_splice, do_splice).
  if (len == 0) return 0;
  if (flags & ~kSpliceFlags) return fail(EINVAL);
  int ifl = real().fcntl(fd_in, F_GETFL), ofl = real().fcntl(fd_out, F_GETFL);
  if (ifl < 0 || ofl < 0) return fail(EBADF);
  bool ipipe = !in && file_type(fd_in, S_IFIFO), opipe = !out && file_type(fd_out, S_IFIFO);
  if ((ipipe && off_in) || (opipe && off_out)) return fail(ESPIPE);
  if (!readable(ifl) || !writable(ofl)) return fail(EBADF);
  len = min_size(len, kMaxRw);
  if (in) {
    if (!opipe || off_in) return fail(EINVAL);
    bool nb = (flags & SPLICE_F_NONBLOCK) || (ofl & O_NONBLOCK);
    return stream_to_pipe(*in->conn, fd_out, len, flags, nb);
  }
  if (!ipipe || off_out) return fail(EINVAL);
  bool nb = (flags & SPLICE_F_NONBLOCK) || (ifl & O_NONBLOCK);
  return pipe_to_stream(*out->conn, fd_in, len, flags, nb);
}

}  // extern "C"
