// rdmaPingPong: the same ping-pong as tcpPingPong, over rdmashim's core
// transport API directly (no interposition): the ceiling the preload aims at.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "api/stream.h"
#include "pingpong.h"

using rdmashim::Listener;
using rdmashim::Stream;
using rdmashim::tools::Channel;
using rdmashim::tools::PingPongOptions;

namespace {

const char* kTool = "rdmaPingPong";

Channel stream_channel(Stream& s) {
  Channel ch;
  ch.recv_all = [&s](void* buf, size_t len) { return s.recv_all(buf, len); };
  ch.send_all = [&s](const void* buf, size_t len) { return s.send_all(buf, len); };
  ch.transport = s.transport();
  return ch;
}

int serve(Listener& l, const PingPongOptions& o, bool once) {
  do {
    int err = 0;
    Stream s = l.accept(&err);
    if (!s) {
      fprintf(stderr, "%s: accept: %s\n", kTool, strerror(-err));
      return 1;
    }
    Channel ch = stream_channel(s);
    int r = o.stream ? rdmashim::tools::serve_stream(ch, o) : rdmashim::tools::serve_pingpong(ch, o.size);
    if (r < 0) fprintf(stderr, "%s: connection ended: %s\n", kTool, strerror(-r));
  } while (!once);
  return 0;
}

int run_client(const PingPongOptions& o) {
  int err = 0;
  Stream s = Stream::connect(o.host.c_str(), o.port, &err);
  if (!s) {
    fprintf(stderr, "%s: cannot connect to %s:%u: %s\n", kTool, o.host.c_str(), o.port, strerror(-err));
    return 1;
  }
  Channel ch = stream_channel(s);
  return o.stream ? rdmashim::tools::run_stream_client(kTool, ch, o) : rdmashim::tools::run_pingpong_client(kTool, ch, o);
}

}  // namespace

int main(int argc, char** argv) {
  PingPongOptions o;
  if (!rdmashim::tools::parse_pingpong_args(kTool, argc, argv, &o, true)) return 2;
  // The core reads its settings from the environment, once.
  if (!o.transport.empty()) setenv("RDMASHIM_TRANSPORT", o.transport.c_str(), 1);
  int err = 0;
  if (o.mode == PingPongOptions::Mode::kClient) return run_client(o);
  const char* host = o.mode == PingPongOptions::Mode::kLocal ? "127.0.0.1" : nullptr;
  Listener l = Listener::listen(host, o.port, &err);
  if (!l) {
    fprintf(stderr, "%s: listen: %s\n", kTool, strerror(-err));
    return 1;
  }
  if (o.mode == PingPongOptions::Mode::kServer) {
    fprintf(stderr, "%s: serving on port %u\n", kTool, l.port());
    return serve(l, o, false);
  }
  o.port = l.port();
  pid_t child = fork();
  if (child < 0) {
    perror("rdmaPingPong: fork");
    return 1;
  }
  if (child == 0) _exit(serve(l, o, true));
  int rc = run_client(o);
  int status = 0;
  waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
