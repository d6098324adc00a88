// Shared by the connection tests: a connected loopback TCP pair, a
// deterministic byte pattern to check streams against, and send_all.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "conn/connection.h"

namespace rdmashim::test {

struct TcpPair {
  int client = -1, server = -1;
  TcpPair() {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(listen(l, 4), 0);
    getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), len), 0);
    server = accept(l, nullptr, nullptr);
    close(l);
  }
  ~TcpPair() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
  TcpPair(const TcpPair&) = delete;
  TcpPair& operator=(const TcpPair&) = delete;
};

inline std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<unsigned char>(x);
  }
  return v;
}

// Writes all of [p, p + n) through the connection; the last send's result
// if it stopped short (0 or a negative errno), else n.
inline ssize_t send_all(Connection& c, const void* p, size_t n, int flags = MSG_NOSIGNAL) {
  size_t done = 0;
  while (done < n) {
    iovec iov{const_cast<char*>(static_cast<const char*>(p)) + done, n - done};
    ssize_t r = c.send(&iov, 1, flags);
    if (r <= 0) return r;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace rdmashim::test
