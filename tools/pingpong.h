// The ping-pong both tcpPingPong (plain sockets) and rdmaPingPong (the core
// API) run: the same loop and the same report, over two kinds of connection.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace rdmashim::tools {

struct PingPongOptions {
  enum class Mode { kServer, kClient, kLocal } mode = Mode::kLocal;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  size_t size = 64;
  uint64_t iters = 100000;
  uint64_t warmup = 0;  // default: min(iters / 10, 10000)
  bool json = false;
  std::string transport;  // rdmaPingPong only
  std::string wait = "block";  // tcpPingPong: block | poll | epoll (non-blocking socket, event-loop style)
  uint64_t connects = 0;  // tcpPingPong --local --connects N: connect + one exchange + close, N times
  uint64_t hold = 0;      // tcpPingPong --local --hold N: N open connections, count descriptors
};

// One connected stream, as the ping-pong sees it: count, 0 at EOF, -errno.
struct Channel {
  std::function<ssize_t(void*, size_t)> recv_all;
  std::function<ssize_t(const void*, size_t)> send_all;
  std::string transport;
};

// Parses argv; prints usage and returns false on bad input.
bool parse_pingpong_args(const char* tool, int argc, char** argv, PingPongOptions* o, bool with_transport);

// Echoes size-byte messages until EOF. Returns 0 or a negative errno.
int serve_pingpong(Channel& ch, size_t size);

// Runs warm-up plus iters round trips and prints the report. Returns an exit code.
int run_pingpong_client(const char* tool, Channel& ch, const PingPongOptions& o);

}  // namespace rdmashim::tools
