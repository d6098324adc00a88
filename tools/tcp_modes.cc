// tcpPingPong's connection modes (--local only; the server is a forked
// child, so under `rdmashim run` both ends upgrade):
//   --connects N  connect, one size-byte exchange, close, N times in a row:
//                 what setting up (and tearing down) a connection costs
//                 (--then N [--gap-ms MS]: MS later, one more connection of
//                 N round trips: what a long-lived one right after gets)
//   --hold N      N connections open at once after one exchange each; both
//                 sides count their open descriptors (/proc/self/fd), all
//                 and those numbered below the soft RLIMIT_NOFILE (the
//                 program's own range), and their resident memory
//                 (--then N: then one more connection makes N round trips
//                 beside the idle ones: its rate and p99)
// --busy K makes --then K connections at once, each in its own thread on
// both sides, N round trips each: their total rate and the p99 of all their
// round trips together (the 10 busy connections beside 10,000 idle ones).
#include "tcp_modes.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tcp_socket.h"
#include "util/misc.h"

namespace rdmashim::tools {
namespace {

// Open descriptors, or (below_limit) those numbered below the soft limit.
int open_fds(bool below_limit = false) {
  rlimit lim{};
  long limit = getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 1L << 30 ? static_cast<long>(lim.rlim_cur) : 1L << 30;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.' && (!below_limit || atol(e->d_name) < limit);
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

// Resident memory of this process (kB), shared pages (the rings) included.
long rss_kb() {
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

bool exchange(Channel& ch, std::vector<char>& buf) {
  return ch.send_all(buf.data(), buf.size()) == static_cast<ssize_t>(buf.size()) &&
         ch.recv_all(buf.data(), buf.size()) == static_cast<ssize_t>(buf.size());
}

bool echo(Channel& ch, std::vector<char>& buf) {
  return ch.recv_all(buf.data(), buf.size()) == static_cast<ssize_t>(buf.size()) &&
         ch.send_all(buf.data(), buf.size()) == static_cast<ssize_t>(buf.size());
}

int accept_one(int listener) {
  for (;;) {
    int fd = accept(listener, nullptr, nullptr);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

// The forked server of both modes. Returns its exit code.
// Accepts one connection and echoes its ping-pong until EOF; 1 if accept failed.
int serve_one(int listener, size_t size) {
  int fd = accept_one(listener);
  if (fd < 0) return perror("accept"), 1;
  tcp_nodelay(fd);
  Channel ch = tcp_channel(fd);
  serve_pingpong(ch, size);
  close(fd);
  return 0;
}

// --then's busy connections: k accepted, each echoed until its EOF in its
// own thread. Returns 0, or 1 if an accept failed.
int serve_busy(int listener, size_t size, uint64_t k) {
  if (k == 1) return serve_one(listener, size);
  std::vector<std::thread> threads;
  int rc = 0;
  for (uint64_t i = 0; i < k && rc == 0; ++i) {
    int fd = accept_one(listener);
    if (fd < 0) {
      perror("accept");
      rc = 1;
      break;
    }
    threads.emplace_back([fd, size] {
      tcp_nodelay(fd);
      Channel ch = tcp_channel(fd);
      serve_pingpong(ch, size);
      close(fd);
    });
  }
  for (auto& t : threads) t.join();
  return rc;
}

int serve(const char* tool, int listener, const PingPongOptions& o) {
  std::vector<char> buf(o.size);
  if (o.connects) {
    // The short ones, then the --then ones: each echoed until its EOF.
    for (uint64_t i = 0; i < o.connects; ++i)
      if (serve_one(listener, o.size) != 0) return 1;
    return o.then_iters ? serve_busy(listener, o.size, o.busy) : 0;
  }
  std::vector<int> fds;
  std::vector<Channel> chans;
  for (uint64_t i = 0; i < o.hold; ++i) {
    int fd = accept_one(listener);
    if (fd < 0) return perror("accept"), 1;
    fds.push_back(fd);
    chans.push_back(tcp_channel(fd));
    if (!echo(chans.back(), buf)) return fprintf(stderr, "%s: exchange %llu failed\n", tool, (unsigned long long)i), 1;
  }
  // Our count (the listener, still open for --then, not counted) goes back
  // on the last connection, in one message.
  std::fill(buf.begin(), buf.end(), '\0');
  snprintf(buf.data(), buf.size(), "%d,\"server_low_fds\":%d,\"server_rss_kb\":%ld", open_fds() - 1, open_fds(true) - 1,
           rss_kb());
  chans.back().send_all(buf.data(), buf.size());
  // The busy ones beside the idle ones, echoed until their EOF.
  if (o.then_iters && serve_busy(listener, o.size, o.busy) != 0) return 1;
  close(listener);
  chans.back().recv_all(buf.data(), buf.size());  // EOF: the client is done
  for (int fd : fds) close(fd);
  return 0;
}

// One busy connection of --then: connects, waits at `start` for the others,
// makes then_iters round trips; their times in ns, false if one failed.
bool busy_one(const char* tool, uint16_t port, const PingPongOptions& o, std::barrier<>& start, std::vector<uint32_t>* ns) {
  int fd = tcp_connect(tool, "127.0.0.1", port);
  start.arrive_and_wait();  // a failed connect arrives too, so the others never wait forever
  if (fd < 0) return false;
  Channel ch = tcp_channel(fd);
  std::vector<char> buf(o.size, 'x');
  ns->reserve(o.then_iters);
  bool ok = true;
  for (uint64_t i = 0; i < o.then_iters && ok; ++i) {
    uint64_t t = now_ns();
    ok = exchange(ch, buf);
    ns->push_back(static_cast<uint32_t>(std::min<uint64_t>(now_ns() - t, UINT32_MAX)));
  }
  close(fd);
  return ok;
}

// --then: after the burst (and --gap-ms), or beside the held connections,
// o.busy connections at once (a thread each), then_iters round trips each.
// Returns their total round trips/s (from when all had connected until the
// last finished; its p99 over all their round trips in *p99_us), or -1.
double long_lived(const char* tool, uint16_t port, const PingPongOptions& o, double* p99_us) {
  if (o.gap_ms) usleep(static_cast<useconds_t>(o.gap_ms * 1000));
  std::vector<std::vector<uint32_t>> ns(o.busy);
  std::vector<char> ok(o.busy, 0);
  std::barrier<> start(static_cast<std::ptrdiff_t>(o.busy) + 1);  // the threads and this one
  std::vector<std::thread> threads;
  for (uint64_t i = 0; i < o.busy; ++i)
    threads.emplace_back([&, i] { ok[i] = busy_one(tool, port, o, start, &ns[i]); });
  start.arrive_and_wait();
  uint64_t t0 = now_ns();
  for (auto& t : threads) t.join();
  double s = static_cast<double>(now_ns() - t0) / 1e9;
  if (std::count(ok.begin(), ok.end(), 0) != 0) return fprintf(stderr, "%s: --then: exchange failed\n", tool), -1;
  std::vector<uint32_t> all;
  for (auto& v : ns) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  *p99_us = all[std::min(all.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(all.size())))] / 1e3;
  return static_cast<double>(o.then_iters * o.busy) / s;
}

}  // namespace

int run_connection_mode(const char* tool, const PingPongOptions& o) {
  uint16_t port = 0;
  int l = tcp_listen(tool, "127.0.0.1", 0, &port);
  if (l < 0) return 1;
  int base = open_fds();  // the client's descriptors before any connection (the listener closed below)
  pid_t child = fork();
  if (child < 0) return perror("fork"), 1;
  if (child == 0) _exit(serve(tool, l, o));
  close(l);
  --base;
  std::vector<char> buf(o.size, 'x');
  int rc = 0;
  if (o.connects) {
    std::vector<uint32_t> ns;
    uint64_t start = now_ns();
    for (uint64_t i = 0; i < o.connects && rc == 0; ++i) {
      uint64_t t0 = now_ns();
      int fd = tcp_connect(tool, "127.0.0.1", port);
      if (fd < 0) {
        rc = 1;
        break;
      }
      Channel ch = tcp_channel(fd);
      if (!exchange(ch, buf)) rc = 1, fprintf(stderr, "%s: exchange on connection %llu failed\n", tool, (unsigned long long)i);
      close(fd);
      ns.push_back(static_cast<uint32_t>(std::min<uint64_t>(now_ns() - t0, UINT32_MAX)));
    }
    double seconds = static_cast<double>(now_ns() - start) / 1e9;
    double then_p99 = 0;
    double then_rate = rc == 0 && o.then_iters ? long_lived(tool, port, o, &then_p99) : 0;
    if (then_rate < 0) rc = 1;
    if (rc == 0) {
      std::sort(ns.begin(), ns.end());
      auto pct = [&](double p) { return ns[std::min(ns.size() - 1, static_cast<size_t>(p * ns.size()))] / 1e3; };
      printf("{\"tool\":\"%s\",\"mode\":\"connects\",\"size\":%zu,\"connections\":%llu,\"seconds\":%.6f,"
             "\"connections_per_s\":%.1f,\"p50_us\":%.3f,\"p99_us\":%.3f",
             tool, o.size, (unsigned long long)o.connects, seconds, static_cast<double>(o.connects) / seconds,
             pct(0.5), pct(0.99));
      if (o.then_iters)
        printf(",\"then_round_trips_per_s\":%.1f,\"then_p99_us\":%.3f,\"then_busy\":%llu,\"gap_ms\":%llu", then_rate,
               then_p99, (unsigned long long)o.busy, (unsigned long long)o.gap_ms);
      printf("}\n");
    }
  } else {
    std::vector<int> fds;
    std::vector<Channel> chans;
    for (uint64_t i = 0; i < o.hold && rc == 0; ++i) {
      int fd = tcp_connect(tool, "127.0.0.1", port);
      if (fd < 0) {
        rc = 1;
        break;
      }
      fds.push_back(fd);
      chans.push_back(tcp_channel(fd));
      if (!exchange(chans.back(), buf)) rc = 1;
    }
    int mine = open_fds(), mine_low = open_fds(true);
    long mine_kb = rss_kb();
    if (rc == 0 && chans.back().recv_all(buf.data(), buf.size()) == static_cast<ssize_t>(buf.size())) {
      buf.back() = '\0';
      std::string server(buf.data());
      double then_p99 = 0;
      double then_rate = o.then_iters ? long_lived(tool, port, o, &then_p99) : 0;
      if (then_rate < 0) rc = 1;
      printf("{\"tool\":\"%s\",\"mode\":\"hold\",\"connections\":%llu,\"client_fds\":%d,\"client_low_fds\":%d,"
             "\"client_base_fds\":%d,\"client_rss_kb\":%ld,\"server_fds\":%s",
             tool, (unsigned long long)o.hold, mine, mine_low, base, mine_kb, server.c_str());
      if (o.then_iters)
        printf(",\"then_round_trips_per_s\":%.1f,\"then_p99_us\":%.3f,\"then_busy\":%llu", then_rate, then_p99,
               (unsigned long long)o.busy);
      printf("}\n");
    } else {
      fprintf(stderr, "%s: --hold: exchanges failed\n", tool);
      rc = 1;
    }
    for (int fd : fds) close(fd);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace rdmashim::tools
