// forkingPingPong: the ping-pong of tcpPingPong, served the way forking
// servers serve (the seed project's tool of the same name, grown three
// server shapes):
//
//   default        accept, fork; the child serves the connection, the parent
//                  closes its copy and accepts the next one (PostgreSQL-style)
//   --prefork N    N workers forked before the first accept share the
//                  listener and each accepts (Apache/unicorn-style)
//   --daemonize    accept, fork, the child forks again and exits at once; the
//                  grandchild (reparented, its own session) serves
//   --detach       (with any shape) the process that called listen() forks
//                  and exits at once; the child (its own session) serves as
//                  above: a daemon that outlives its starter
//
// Nothing rdmashim-specific in it: run it under `rdmashim run` to see fork
// generations upgrade lazily (or, with RDMASHIM_FORKGEN, not at all).
//
// Every process that served a connection says so on stderr:
//   forkingPingPong[PID]: served a connection (child|worker|grandchild): ok
// so a test can match the serving pids against what rdmashim reports.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "pingpong.h"
#include "json.h"
#include "tcp_socket.h"
#include "util/misc.h"

using rdmashim::now_ns;
using rdmashim::tools::Channel;
using rdmashim::tools::PingPongOptions;
using rdmashim::tools::tcp_channel;
using rdmashim::tools::tcp_connect;
using rdmashim::tools::tcp_listen;
using rdmashim::tools::tcp_nodelay;

namespace {

const char* kTool = "forkingPingPong";

enum class Shape { kForkPerConnection, kPrefork, kDaemonize };

struct ForkOptions {
  Shape shape = Shape::kForkPerConnection;
  unsigned workers = 0;  // --prefork N
  unsigned clients = 1;  // --clients C: concurrent client connections
  uint64_t conns = 0;    // --conns K: the server exits after K connections (0: never)
  bool detach = false;   // --detach: the listen() caller exits, a child serves
};

// State the prefork workers share with their parent (a MAP_SHARED page).
struct Shared {
  std::atomic<uint64_t> accepted;
  std::atomic<uint64_t> served;
  std::atomic<uint64_t> failed;
};

const char* shape_name(Shape s) {
  switch (s) {
    case Shape::kForkPerConnection: return "child";
    case Shape::kPrefork: return "worker";
    case Shape::kDaemonize: return "grandchild";
  }
  return "?";
}

void usage() {
  fprintf(stderr,
          "usage: %s --local [options]            server and clients on this host\n"
          "       %s server [--port P] [options]  serve, forking as below\n"
          "       %s client HOST[:PORT] [options]\n"
          "server shape: (default) fork per connection | --prefork N | --daemonize\n"
          "              --detach: the process that listened exits, its child serves\n"
          "options: --size BYTES (64) --iters N (100000, per client) --warmup N --json\n"
          "         --clients C (1: concurrent client connections)\n"
          "         --conns K (server: exit after K connections; --local: the clients)\n",
          kTool, kTool, kTool);
}

// Takes our own options out of argv; the rest goes to parse_pingpong_args.
bool split_args(int argc, char** argv, ForkOptions* f, std::vector<char*>* rest) {
  rest->push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](uint64_t lo, uint64_t hi, uint64_t* out) {
      char* end = nullptr;
      if (i + 1 >= argc || argv[i + 1][0] < '0' || argv[i + 1][0] > '9') return false;
      unsigned long long v = strtoull(argv[i + 1], &end, 10);
      if (*end != '\0' || v < lo || v > hi) return false;
      *out = v;
      ++i;
      return true;
    };
    uint64_t v = 0;
    if (a == "--prefork") {
      if (!value(1, 256, &v)) return fprintf(stderr, "%s: --prefork needs 1..256\n", kTool), false;
      f->shape = Shape::kPrefork;
      f->workers = static_cast<unsigned>(v);
    } else if (a == "--daemonize") {
      f->shape = Shape::kDaemonize;
    } else if (a == "--detach") {
      f->detach = true;
    } else if (a == "--clients") {
      if (!value(1, 1024, &v)) return fprintf(stderr, "%s: --clients needs 1..1024\n", kTool), false;
      f->clients = static_cast<unsigned>(v);
    } else if (a == "--conns") {
      if (!value(1, UINT32_MAX, &v)) return fprintf(stderr, "%s: --conns needs a positive number\n", kTool), false;
      f->conns = v;
    } else if (a == "-h" || a == "--help") {
      usage();
      exit(0);
    } else {
      rest->push_back(argv[i]);
    }
  }
  rest->push_back(nullptr);
  return true;
}

// Serves one accepted connection in the calling process and says so.
// Returns 0 or a negative errno.
int serve_one(int fd, size_t size, Shape shape) {
  tcp_nodelay(fd);
  Channel ch = tcp_channel(fd);
  int r = rdmashim::tools::serve_pingpong(ch, size);
  close(fd);
  fprintf(stderr, "%s[%d]: served a connection (%s): %s\n", kTool, static_cast<int>(getpid()), shape_name(shape),
          r == 0 ? "ok" : strerror(-r));
  return r;
}

volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

// Accepts, retrying on interruptions unless a stop was asked for.
int accept_retry(int listener) {
  for (;;) {
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return fd;
    if ((errno == EINTR && !g_stop) || errno == ECONNABORTED) continue;
    return -1;
  }
}

void default_signals() {
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
}

// Reaps children that exited; counts the ones that failed.
void reap(bool block, unsigned* live, unsigned* failed) {
  for (;;) {
    int status = 0;
    pid_t p = waitpid(-1, &status, block && *live > 0 ? 0 : WNOHANG);
    if (p <= 0) {
      if (p < 0 && errno == EINTR && block) continue;
      return;
    }
    if (*live > 0) --*live;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++*failed;
  }
}

// Fork per connection, directly or through an intermediate child.
//
// With --conns K the listener stays open until every connection was served
// (children reaped; daemonized grandchildren, which nobody can wait for,
// hold the write end of a pipe until they exit): a client may still be
// looking for the listener (rdmashim checks its advertisement right after
// connect) when the K-th connection is accepted.
int serve_forking(int listener, const PingPongOptions& o, const ForkOptions& f) {
  unsigned live = 0, failed = 0;
  uint64_t accepted = 0;
  int served_pipe[2] = {-1, -1};  // daemonize: EOF once every grandchild exited
  if (f.shape == Shape::kDaemonize && pipe2(served_pipe, O_CLOEXEC) != 0) {
    perror("forkingPingPong: pipe");
    return 1;
  }
  while (f.conns == 0 || accepted < f.conns) {
    reap(false, &live, &failed);
    int fd = accept_retry(listener);
    if (fd < 0) {
      if (g_stop) break;
      perror("forkingPingPong: accept");
      return 1;
    }
    ++accepted;
    pid_t child = fork();
    if (child < 0) {
      perror("forkingPingPong: fork");
      close(fd);
      ++failed;
      continue;
    }
    if (child == 0) {
      default_signals();
      close(listener);
      if (f.shape == Shape::kDaemonize) {
        close(served_pipe[0]);
        pid_t grandchild = fork();
        if (grandchild < 0) _exit(1);
        if (grandchild > 0) _exit(0);  // the intermediate child; our fd copy dies with it
        setsid();
        int r = serve_one(fd, o.size, f.shape);
        _exit(r == 0 ? 0 : 1);  // served_pipe[1] closes here
      }
      _exit(serve_one(fd, o.size, f.shape) == 0 ? 0 : 1);
    }
    ++live;
    close(fd);  // the child (or grandchild) owns the connection now
    if (f.shape == Shape::kDaemonize) {
      // The intermediate child exits at once; reap it so nothing lingers.
      int status = 0;
      while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
      }
      --live;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
  }
  if (served_pipe[1] >= 0) {
    close(served_pipe[1]);
    char c;
    while (!g_stop && read(served_pipe[0], &c, 1) != 0 && (errno == EINTR || errno == EAGAIN)) {
    }
    close(served_pipe[0]);
  }
  reap(true, &live, &failed);
  close(listener);
  if (failed) fprintf(stderr, "%s: %u connection(s) failed\n", kTool, failed);
  return failed ? 1 : 0;
}

// N workers, forked before any accept, each accepting on the shared listener.
int serve_prefork(int listener, const PingPongOptions& o, const ForkOptions& f) {
  void* page = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    perror("forkingPingPong: mmap");
    return 1;
  }
  Shared* sh = new (page) Shared{};
  std::vector<pid_t> workers;
  for (unsigned w = 0; w < f.workers; ++w) {
    pid_t p = fork();
    if (p < 0) {
      perror("forkingPingPong: fork");
      break;
    }
    if (p == 0) {
      default_signals();
      for (;;) {
        int fd = accept_retry(listener);
        if (fd < 0) {
          perror("forkingPingPong: accept (worker)");
          _exit(1);
        }
        sh->accepted.fetch_add(1);
        if (serve_one(fd, o.size, f.shape) != 0) sh->failed.fetch_add(1);
        sh->served.fetch_add(1);
      }
    }
    workers.push_back(p);
  }
  int rc = workers.size() == f.workers ? 0 : 1;
  // Until K connections were served (or forever), or a signal, or a worker died.
  while (rc == 0 && !g_stop && (f.conns == 0 || sh->served.load() < f.conns)) {
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      fprintf(stderr, "%s: worker %d ended unexpectedly\n", kTool, static_cast<int>(p));
      workers.erase(std::remove(workers.begin(), workers.end(), p), workers.end());
      rc = 1;
      break;
    }
    usleep(5000);
  }
  for (pid_t p : workers) kill(p, SIGTERM);
  for (pid_t p : workers) {
    while (waitpid(p, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  close(listener);
  if (sh->failed.load()) {
    fprintf(stderr, "%s: %llu connection(s) failed\n", kTool, static_cast<unsigned long long>(sh->failed.load()));
    rc = 1;
  }
  return rc;
}

int serve(int listener, const PingPongOptions& o, const ForkOptions& f) {
  struct sigaction sa {};
  sa.sa_handler = on_stop;  // no SA_RESTART: a blocked accept() returns EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return f.shape == Shape::kPrefork ? serve_prefork(listener, o, f) : serve_forking(listener, o, f);
}

// One client connection: warm-up plus iters checked round trips.
struct ClientResult {
  bool ok = false;
  std::vector<uint32_t> rtt_ns;
};

void run_client(const PingPongOptions& o, unsigned id, ClientResult* r) {
  int fd = tcp_connect(kTool, o.host, o.port);
  if (fd < 0) return;
  Channel ch = tcp_channel(fd);
  std::vector<char> out(o.size), in(o.size);
  for (size_t i = 0; i < o.size; ++i) out[i] = static_cast<char>(i * 131 + 7 + id);
  r->rtt_ns.reserve(o.iters);
  for (uint64_t i = 0; i < o.warmup + o.iters; ++i) {
    uint64_t t0 = now_ns();
    out[0] = static_cast<char>(i);
    ssize_t sent = ch.send_all(out.data(), o.size);
    if (sent != static_cast<ssize_t>(o.size)) {
      fprintf(stderr, "%s: client %u: send failed at round trip %llu: %s\n", kTool, id,
              static_cast<unsigned long long>(i), strerror(sent < 0 ? static_cast<int>(-sent) : EPIPE));
      close(fd);
      return;
    }
    ssize_t n = ch.recv_all(in.data(), o.size);
    if (n != static_cast<ssize_t>(o.size)) {
      fprintf(stderr, "%s: client %u: %s at round trip %llu\n", kTool, id,
              n == 0 ? "server closed the connection" : "receive failed", static_cast<unsigned long long>(i));
      close(fd);
      return;
    }
    if (memcmp(in.data(), out.data(), o.size) != 0) {
      fprintf(stderr, "%s: client %u: echo mismatch at round trip %llu\n", kTool, id,
              static_cast<unsigned long long>(i));
      close(fd);
      return;
    }
    if (i >= o.warmup) {
      uint64_t d = now_ns() - t0;
      r->rtt_ns.push_back(static_cast<uint32_t>(d > UINT32_MAX ? UINT32_MAX : d));
    }
  }
  close(fd);
  r->ok = true;
}

// C concurrent clients, one report over all their round trips.
int run_clients(const PingPongOptions& o, const ForkOptions& f) {
  std::vector<ClientResult> results(f.clients);
  uint64_t start = now_ns();
  std::vector<std::thread> threads;
  for (unsigned c = 0; c < f.clients; ++c) threads.emplace_back(run_client, std::cref(o), c, &results[c]);
  for (auto& t : threads) t.join();
  double seconds = static_cast<double>(now_ns() - start) / 1e9;
  std::vector<uint32_t> all;
  unsigned failed = 0;
  for (auto& r : results) {
    if (!r.ok) ++failed;
    all.insert(all.end(), r.rtt_ns.begin(), r.rtt_ns.end());
  }
  if (failed) {
    fprintf(stderr, "%s: %u of %u client(s) failed\n", kTool, failed, f.clients);
    return 1;
  }
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))] / 1e3; };
  uint64_t total = all.size();
  double rate = static_cast<double>(total) / seconds;
  double sum = 0;
  for (uint32_t v : all) sum += v;
  double avg = sum / static_cast<double>(total) / 1e3;
  if (o.json) {
    printf("{\"tool\":%s,\"transport\":\"tcp\",\"size\":%zu,\"iters\":%llu,\"clients\":%u,\"seconds\":%.6f,"
           "\"round_trips_per_s\":%.1f,\"avg_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f,\"max_us\":%.3f}\n",
           rdmashim::tools::json_quote(kTool).c_str(), o.size, static_cast<unsigned long long>(o.iters), f.clients,
           seconds, rate, avg, pct(0.50),
           pct(0.99), all.back() / 1e3);
  } else {
    printf("%s: %zu B x %llu round trips x %u client(s) over tcp: %.0f round trips/s, avg %.2f us, p50 %.2f us, "
           "p99 %.2f us\n",
           kTool, o.size, static_cast<unsigned long long>(o.iters), f.clients, rate, avg, pct(0.50), pct(0.99));
  }
  fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ForkOptions f;
  std::vector<char*> rest;
  if (!split_args(argc, argv, &f, &rest)) return usage(), 2;
  PingPongOptions o;
  if (!rdmashim::tools::parse_pingpong_args(kTool, static_cast<int>(rest.size()) - 1, rest.data(), &o, false))
    return 2;
  if (o.wait != "block") {
    fprintf(stderr, "%s: only --wait block is supported\n", kTool);
    return 2;
  }
  setvbuf(stderr, nullptr, _IOLBF, 0);
  if (o.mode == PingPongOptions::Mode::kServer) {
    uint16_t port = 0;
    int l = tcp_listen(kTool, o.host == "127.0.0.1" ? nullptr : o.host.c_str(), o.port, &port);
    if (l < 0) return 1;
    fprintf(stderr, "%s[%d]: serving on port %u\n", kTool, static_cast<int>(getpid()), port);
    if (f.detach) {
      pid_t p = fork();
      if (p < 0) return perror("forkingPingPong: fork"), 1;
      if (p > 0) _exit(0);  // the listen() caller leaves; the child serves
      setsid();
      fprintf(stderr, "%s[%d]: detached\n", kTool, static_cast<int>(getpid()));
    }
    return serve(l, o, f);
  }
  if (o.mode == PingPongOptions::Mode::kLocal) {
    o.host = "127.0.0.1";
    o.port = 0;
    uint16_t port = 0;
    int l = tcp_listen(kTool, o.host.c_str(), o.port, &port);
    if (l < 0) return 1;
    if (f.conns == 0) f.conns = f.clients;
    fflush(nullptr);
    pid_t server = fork();
    if (server < 0) {
      perror("forkingPingPong: fork");
      return 1;
    }
    if (server == 0) _exit(serve(l, o, f));
    close(l);
    o.port = port;
    int rc = run_clients(o, f);
    if (rc != 0) kill(server, SIGTERM);
    int status = 0;
    while (waitpid(server, &status, 0) < 0 && errno == EINTR) {
    }
    return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  return run_clients(o, f);
}
