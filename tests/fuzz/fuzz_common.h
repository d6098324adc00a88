// Shared by the libFuzzer targets: a quiet, fast configuration (set before
// the core reads its configuration once) and the peer's side of a socket.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace rdmashim::fuzz {

inline void quiet_fast_config() {
  setenv("RDMASHIM_LOG", "off", 1);             // broken() warns per bad frame
  setenv("RDMASHIM_SETUP_TIMEOUT_MS", "1", 1);  // waits for a peer that never comes end at once
  setenv("RDMASHIM_RING_SIZE", "4096", 1);      // a segment per accepted Hello: keep it small
  setenv("RDMASHIM_TRANSPORT", "shm", 1);       // no RDMA device lookups
}

inline void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Writes what the peer sends (as much as the socket takes), then its FIN.
inline void peer_sends(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    ssize_t n = send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;
    data += n;
    size -= static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
}

// Closes with a reset: no TIME_WAIT left behind by thousands of runs.
inline void close_hard(int fd) {
  linger lg{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fd);
}

}  // namespace rdmashim::fuzz
