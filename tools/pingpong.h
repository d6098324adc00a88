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
  // --ms T: the ping-pong stops after T ms (warm-up included), iters is then
  // the most it makes; the report counts the round trips it did.
  uint64_t ms = 0;
  bool json = false;
  std::string transport;  // rdmaPingPong only
  std::string wait = "block";  // tcpPingPong: block | poll | epoll (non-blocking socket, event-loop style)
  // --stream: one-way throughput instead: the client writes `bytes` in
  // size-byte writes, the server reads them all and answers one byte.
  bool stream = false;
  uint64_t bytes = uint64_t{1} << 30;
  // --idle-ms: after the stream the connection stays idle this long, then
  // the server reports the memory the connection still holds (idle_memory).
  uint64_t idle_ms = 0;
  // --rate B: the stream's writes paced to B bytes/s (0: as fast as it goes).
  uint64_t rate = 0;
  bool unix_socket = false;  // tcpPingPong --unix: an abstract Unix socket instead of loopback TCP
  uint64_t connects = 0;  // tcpPingPong --local --connects N: connect + one exchange + close, N times
  // --then N [--gap-ms MS]: after the connects, wait MS, then one more
  // connection makes N round trips (a long-lived one right after a burst).
  uint64_t then_iters = 0;
  uint64_t gap_ms = 0;
  // --busy K: --then's round trips on K connections at once (a thread each,
  // both sides), e.g. 10 busy connections beside --hold's idle ones.
  uint64_t busy = 1;
  uint64_t hold = 0;      // tcpPingPong --local --hold N: N open connections, count descriptors
};

// One connected stream, as the ping-pong sees it: count, 0 at EOF, -errno.
struct Channel {
  std::function<ssize_t(void*, size_t)> recv_all;
  std::function<ssize_t(const void*, size_t)> send_all;
  std::string transport;
  // Bytes this connection still holds on the serving side (tcpPingPong: the
  // socket's kernel memory plus any memfd's allocated blocks); may be unset.
  std::function<uint64_t()> idle_memory;
};

// Parses argv; prints usage and returns false on bad input.
bool parse_pingpong_args(const char* tool, int argc, char** argv, PingPongOptions* o, bool with_transport);

// Echoes size-byte messages until EOF. Returns 0 or a negative errno.
int serve_pingpong(Channel& ch, size_t size);

// --stream: the serving side reads o.bytes, answers one byte, and with
// --idle-ms reports idle_memory() after that long (8 bytes). 0 or -errno.
int serve_stream(Channel& ch, const PingPongOptions& o);
// --stream: the client side; prints bytes/s (and the idle memory). Exit code.
int run_stream_client(const char* tool, Channel& ch, const PingPongOptions& o);

// Runs warm-up plus iters round trips and prints the report. Returns an exit code.
int run_pingpong_client(const char* tool, Channel& ch, const PingPongOptions& o);

}  // namespace rdmashim::tools
