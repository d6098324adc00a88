// Shared by the connection tests: a connected loopback TCP pair, and a
// deterministic byte pattern to check streams against.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

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

}  // namespace rdmashim::test
