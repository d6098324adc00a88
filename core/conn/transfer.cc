// recv_to: the receive side of splice() and sendfile() out of a stream. The
// kernel moves socket bytes into a pipe only as far as the pipe takes them;
// a copy loop that reads first and writes later would lose what the pipe
// refuses. So the bytes are peeked, offered, and only what was taken is
// consumed, all under the receive lock (as the kernel holds the socket's).
#include <sys/socket.h>

#include <cerrno>

#include "conn/connection.h"
#include "sys/calls.h"

namespace rdmashim {

ssize_t Connection::recv_to(size_t len, int flags, Sink sink, void* ctx) {
  io_started_.store(true, std::memory_order_relaxed);
  // splice()/sendfile() have no socket call family of their own: the socket
  // is read the way the program last read or wrote it (sys/calls.h).
  sys::CallScope scope(last_calls_.load(std::memory_order_relaxed), false);
  if (orphaned_) return -ECONNRESET;
  std::lock_guard<std::mutex> lock(rx_mu_);
  follow_sibling_switch_rx();
  char buf[64 * 1024];
  size_t done = 0;
  while (done < len) {
    size_t want = len - done < sizeof buf ? len - done : sizeof buf;
    iovec iov{buf, want};
    // The first look waits as the caller's recv would; later ones take only
    // what is there, like the kernel's splice read after some progress.
    int f = MSG_PEEK | (done > 0 ? flags | MSG_DONTWAIT : flags);
    ssize_t got = recv_some(&iov, 1, f);
    if (got <= 0) return done > 0 ? static_cast<ssize_t>(done) : got;
    ssize_t took = sink(ctx, buf, static_cast<size_t>(got));
    if (took <= 0) return done > 0 ? static_cast<ssize_t>(done) : took;
    // Consume exactly what the sink took: those bytes are there, in order
    // (unless another process sharing a plain TCP socket took them first).
    for (size_t left = static_cast<size_t>(took); left > 0;) {
      iovec c{buf, left};
      ssize_t r = recv_some(&c, 1, MSG_DONTWAIT);
      if (r <= 0) break;
      left -= static_cast<size_t>(r);
    }
    done += static_cast<size_t>(took);
    if (took < got) break;
  }
  return static_cast<ssize_t>(done);
}

}  // namespace rdmashim
