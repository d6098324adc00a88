// tcpPingPong: a plain-sockets ping-pong. Nothing rdmashim-specific in it:
// run it as it is for the TCP baseline, and under `rdmashim run` to measure
// what the preload does for an unmodified program.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "pingpong.h"
#include "tcp_modes.h"
#include "tcp_socket.h"

using rdmashim::tools::Channel;
using rdmashim::tools::PingPongOptions;
using rdmashim::tools::tcp_channel;
using rdmashim::tools::tcp_connect;
using rdmashim::tools::tcp_listen;
using rdmashim::tools::tcp_nodelay;

namespace {

const char* kTool = "tcpPingPong";

int serve(int listener, const PingPongOptions& o, bool once) {
  do {
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR) continue;
      perror("tcpPingPong: accept");
      return 1;
    }
    tcp_nodelay(fd);
    Channel ch = tcp_channel(fd, o.wait);
    int r = rdmashim::tools::serve_pingpong(ch, o.size);
    if (r < 0) fprintf(stderr, "%s: connection ended: %s\n", kTool, strerror(-r));
    close(fd);
  } while (!once);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  PingPongOptions o;
  if (!rdmashim::tools::parse_pingpong_args(kTool, argc, argv, &o, false)) return 2;
  if (o.mode == PingPongOptions::Mode::kServer) {
    uint16_t port = 0;
    int l = tcp_listen(kTool, o.mode == PingPongOptions::Mode::kServer && o.host == "127.0.0.1" ? nullptr : o.host.c_str(), o.port, &port);
    if (l < 0) return 1;
    fprintf(stderr, "%s: serving on port %u\n", kTool, port);
    return serve(l, o, false);
  }
  if (o.connects || o.hold) {
    if (o.mode != PingPongOptions::Mode::kLocal) {
      fprintf(stderr, "%s: --connects and --hold need --local\n", kTool);
      return 2;
    }
    return rdmashim::tools::run_connection_mode(kTool, o);
  }
  if (o.mode == PingPongOptions::Mode::kLocal) {
    o.host = "127.0.0.1";
    uint16_t port = 0;
    int l = tcp_listen(kTool, o.mode == PingPongOptions::Mode::kServer && o.host == "127.0.0.1" ? nullptr : o.host.c_str(), o.port, &port);
    if (l < 0) return 1;
    pid_t child = fork();
    if (child < 0) {
      perror("tcpPingPong: fork");
      return 1;
    }
    if (child == 0) _exit(serve(l, o, true));
    close(l);
    o.port = port;
    int fd = tcp_connect(kTool, o.host, o.port);
    int rc = 1;
    if (fd >= 0) {
      Channel ch = tcp_channel(fd, o.wait);
      rc = rdmashim::tools::run_pingpong_client(kTool, ch, o);
      close(fd);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  int fd = tcp_connect(kTool, o.host, o.port);
  if (fd < 0) return 1;
  Channel ch = tcp_channel(fd, o.wait);
  int rc = rdmashim::tools::run_pingpong_client(kTool, ch, o);
  close(fd);
  return rc;
}
