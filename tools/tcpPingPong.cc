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
#include <sys/stat.h>
#include <dirent.h>
#include <linux/sock_diag.h>
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

// What a connection holds in this process: the socket's kernel memory
// (SO_MEMINFO: receive queue, send queue, forward allocation) plus the
// allocated blocks of every memfd we have open (a preload's rings, if any;
// the serving process has this one connection only).
uint64_t connection_memory(int fd) {
  uint64_t total = 0;
  uint32_t mem[SK_MEMINFO_VARS] = {};
  socklen_t len = sizeof mem;
  if (getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &len) == 0) {
    total += uint64_t{mem[SK_MEMINFO_RMEM_ALLOC]} + mem[SK_MEMINFO_WMEM_QUEUED] + mem[SK_MEMINFO_FWD_ALLOC];
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char path[300], target[256];
      snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
      ssize_t n = readlink(path, target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      struct stat st{};
      // rdmashim's per-process counter page is no connection's.
      if (strncmp(target, "/memfd:", 7) == 0 && !strstr(target, "rdmashim-stats") && stat(path, &st) == 0) total += uint64_t(st.st_blocks) * 512;
    }
    closedir(d);
  }
  return total;
}

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
    ch.idle_memory = [fd] { return connection_memory(fd); };
    int r = o.stream ? rdmashim::tools::serve_stream(ch, o) : rdmashim::tools::serve_pingpong(ch, o.size);
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
  if (o.unix_socket) {
    if (o.mode != PingPongOptions::Mode::kLocal) {
      fprintf(stderr, "%s: --unix needs --local\n", kTool);
      return 2;
    }
    rdmashim::tools::use_unix_sockets(std::string(kTool) + "-" + std::to_string(getpid()));
  }
  if (o.connects || o.hold) {
    if (o.mode != PingPongOptions::Mode::kLocal || o.stream) {
      fprintf(stderr, "%s: --connects and --hold need --local (and no --stream)\n", kTool);
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
      rc = o.stream ? rdmashim::tools::run_stream_client(kTool, ch, o) : rdmashim::tools::run_pingpong_client(kTool, ch, o);
      close(fd);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  int fd = tcp_connect(kTool, o.host, o.port);
  if (fd < 0) return 1;
  Channel ch = tcp_channel(fd, o.wait);
  int rc = o.stream ? rdmashim::tools::run_stream_client(kTool, ch, o) : rdmashim::tools::run_pingpong_client(kTool, ch, o);
  close(fd);
  return rc;
}
