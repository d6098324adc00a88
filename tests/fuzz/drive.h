// Drives a Connection the way an application would, with the peer's bytes
// already queued: bounded reads (plain, peek, waitall-free), readiness
// questions and a write, until EOF, an error or the turn limit.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

#include "conn/connection.h"

namespace rdmashim::fuzz {

inline void drive(Connection& c, uint8_t style) {
  unsigned char buf[4096];
  for (int turn = 0; turn < 64; ++turn) {
    size_t want = 1 + ((style + turn * 37u) % sizeof buf);
    iovec iov{buf, want};
    int flags = MSG_DONTWAIT | ((style & 1) && turn % 3 == 1 ? MSG_PEEK : 0);
    (void)c.poll_events(POLLIN | POLLOUT, POLLIN | POLLOUT);
    ssize_t n = c.recv(&iov, 1, flags);
    if ((style & 2) && turn == 2) {
      iovec out{const_cast<char*>("reply"), 5};
      (void)c.send(&out, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (n == 0) break;
    if (n < 0 && n != -EAGAIN && n != -EINTR) break;
    (void)c.unread_bytes();
  }
  if (style & 4) (void)c.shutdown(SHUT_WR);
  c.drain_before_close();
}

}  // namespace rdmashim::fuzz
