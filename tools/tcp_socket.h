// Plain-socket helpers the socket ping-pongs share (tcpPingPong,
// forkingPingPong): listening, connecting, and a Channel over a socket that
// blocks, or waits in poll()/epoll_wait() as event-loop servers do. They
// call the socket API by name, so under `rdmashim run` they go through it.
#pragma once

#include <cstdint>
#include <string>

#include "pingpong.h"

namespace rdmashim::tools {

// A listening socket on host:port (host nullptr: the wildcard; port 0: any),
// its port in *bound; -1 after printing why as `tool`.
int tcp_listen(const char* tool, const char* host, uint16_t port, uint16_t* bound);
// A connected socket with TCP_NODELAY; -1 after printing why.
int tcp_connect(const char* tool, const std::string& host, uint16_t port);
void tcp_nodelay(int fd);
// A Channel over fd; mode "block", "poll" or "epoll" (the socket is made
// non-blocking and each try that would block first waits for readiness).
Channel tcp_channel(int fd, const std::string& mode = "block");
// tcpPingPong --unix: from now on tcp_listen and tcp_connect use the
// abstract Unix socket `name` (host and port ignored): the same-host
// alternative a user would configure instead of loopback TCP.
void use_unix_sockets(const std::string& name);

}  // namespace rdmashim::tools
