// Plain clients whose bytes start like rdmashim's Hello (0xFF 'rdmashH'),
// against an echo server under the preload in one I/O model, as TCP would
// serve them: bytes that differ from the magic at once, a stalled true
// prefix of it at the latest after RDMASHIM_SETUP_TIMEOUT_MS, and the server
// never burning CPU meanwhile.
//
//   hello_edge server MODEL PORTFILE   echo server (MODEL: blocking poll select epoll-lt epoll-et),
//                                      one connection at a time, until killed
//   hello_edge client PORT PID TIMEOUT_MS   plain client: runs every case against
//                                      server PID, prints figures, exit 1 on a failed check
//   hello_edge control PORT [close-range]  one echo round trip (run under rdmashim: it
//                                      upgrades); close-range: see run_control
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include <string>
#include <vector>

namespace {

double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

[[noreturn]] void die(const char* what) {
  perror(what);
  exit(2);
}

// ---------------------------------------------------------------------------
// Server

void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Echoes everything readable now; false at EOF or error.
bool echo_available(int fd, bool until_eagain) {
  for (;;) {
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    if (write(fd, buf, static_cast<size_t>(n)) != n) return false;
    if (!until_eagain) return true;
  }
}

void serve(int fd, const std::string& model) {
  if (model == "blocking") {
    while (echo_available(fd, false)) {
    }
    return;
  }
  set_nonblock(fd);
  if (model == "poll") {
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, -1) < 0 && errno != EINTR) return;
      if (p.revents && !echo_available(fd, true)) return;
    }
  }
  if (model == "select") {
    for (;;) {
      fd_set r;
      FD_ZERO(&r);
      FD_SET(fd, &r);
      if (select(fd + 1, &r, nullptr, nullptr, nullptr) < 0 && errno != EINTR) return;
      if (FD_ISSET(fd, &r) && !echo_available(fd, true)) return;
    }
  }
  bool et = model == "epoll-et";
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN | (et ? static_cast<uint32_t>(EPOLLET) : 0u);
  ev.data.fd = fd;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
  for (;;) {
    epoll_event got[4];
    int n = epoll_wait(ep, got, 4, -1);
    if (n < 0 && errno != EINTR) break;
    // Level-triggered reads once per wakeup (the set reports again); edge reads until EAGAIN.
    if (n > 0 && !echo_available(fd, et)) break;
  }
  close(ep);
}

int run_server(const std::string& model, const char* port_file) {
  if (model != "blocking" && model != "poll" && model != "select" && model != "epoll-lt" && model != "epoll-et") {
    fprintf(stderr, "unknown model %s\n", model.c_str());
    return 2;
  }
  int l = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(l, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(l, 16) != 0) die("listen");
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  std::string tmp = std::string(port_file) + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) die("port file");
  fprintf(f, "%d\n", ntohs(a.sin_port));
  fclose(f);
  rename(tmp.c_str(), port_file);
  for (;;) {
    int c = accept(l, nullptr, nullptr);
    if (c < 0) continue;
    serve(c, model);
    close(c);
  }
}

// ---------------------------------------------------------------------------
// Clients

int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// CPU time of a process so far (all its threads), in ms, from the
// scheduler's nanosecond accounting (utime/stime tick too coarsely).
double cpu_ms(int pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR* d = opendir(path);
  if (!d) die("/proc/PID/task");
  double total = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string p = std::string(path) + "/" + e->d_name + "/schedstat";
    FILE* f = fopen(p.c_str(), "r");
    if (!f) continue;  // a thread that just ended
    unsigned long long ns = 0;
    if (fscanf(f, "%llu", &ns) == 1) total += ns / 1e6;
    fclose(f);
  }
  closedir(d);
  return total;
}

// Reads exactly n bytes within limit_ms; returns ms taken, or -1.
double read_echo(int fd, size_t n, double limit_ms, std::vector<unsigned char>* out) {
  double t0 = now_ms();
  while (out->size() < n) {
    int left = static_cast<int>(limit_ms - (now_ms() - t0));
    if (left <= 0) return -1;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    unsigned char buf[256];
    ssize_t r = read(fd, buf, sizeof buf);
    if (r <= 0) return -1;
    out->insert(out->end(), buf, buf + r);
  }
  return now_ms() - t0;
}

struct Case {
  const char* name;
  std::vector<unsigned char> first;  // sent at once
  double stall_ms;                   // then nothing for this long
  std::vector<unsigned char> then;   // then these (measured from here)
  bool fin;                          // then shut down writing
  bool waits;                        // true prefix: delivered at the setup timeout, not at once
};

int run_client(int port, int pid, double timeout_ms) {
  const unsigned char ff = 0xFF;
  std::vector<unsigned char> prefix = {0xFF, 'r', 'd', 'm', 'a', 's', 'h'};
  std::vector<Case> cases = {
      {"ff-then-nothing", {ff}, 0, {}, false, true},
      {"ff-then-other-bytes", {ff, 'x', 'y', 'z'}, 0, {}, false, false},
      {"stalled-true-prefix", prefix, 0, {}, false, true},
      {"prefix-stall-then-other-byte", {ff, 'r', 'd'}, timeout_ms / 3, {'Q'}, false, false},
      {"prefix-then-fin", {ff, 'r'}, 0, {}, true, false},
  };
  const double quick_ms = 200, margin_ms = 400;
  int failed = 0;
  for (const Case& c : cases) {
    int fd = connect_to(port);
    double cpu0 = cpu_ms(pid), t0 = now_ms();
    if (write(fd, c.first.data(), c.first.size()) != static_cast<ssize_t>(c.first.size())) die("write");
    std::vector<unsigned char> sent = c.first, got;
    double limit = c.waits ? timeout_ms + margin_ms : quick_ms;
    double took;
    if (c.stall_ms > 0) {
      // Nothing may arrive during the stall (a prefix waits), and then the
      // differing byte releases everything at once.
      took = read_echo(fd, 1, c.stall_ms, &got);
      if (took >= 0) {
        printf("FAIL %s: %zu bytes echoed during the stall, after %.1f ms\n", c.name, got.size(), took);
        ++failed;
      }
      sent.insert(sent.end(), c.then.begin(), c.then.end());
      if (write(fd, c.then.data(), c.then.size()) != static_cast<ssize_t>(c.then.size())) die("write");
    }
    if (c.fin) shutdown(fd, SHUT_WR);
    double t1 = now_ms();
    took = read_echo(fd, sent.size(), limit, &got);
    double wall = now_ms() - t0, cpu = cpu_ms(pid) - cpu0;
    bool ok = took >= 0 && got == sent;
    if (c.waits && ok && took < timeout_ms * 0.8) {
      printf("FAIL %s: delivered after %.1f ms, before the setup timeout (%.0f ms)\n", c.name, took, timeout_ms);
      ok = false;
    }
    // The server may burn at most 2% of the wall time (plus 2 ms for the work itself).
    double cpu_limit = wall * 0.02 + 2;
    printf("%s %s: %zu/%zu bytes echoed in %.1f ms (limit %.0f), server cpu %.2f ms over %.1f ms\n",
           ok ? "ok" : "FAIL", c.name, got.size(), sent.size(), took < 0 ? now_ms() - t1 : took, limit, cpu, wall);
    if (!ok) ++failed;
    if (cpu > cpu_limit) {
      printf("FAIL %s: server used %.1f ms of cpu in %.1f ms (limit %.1f)\n", c.name, cpu, wall, cpu_limit);
      ++failed;
    }
    close(fd);
  }
  return failed ? 1 : 0;
}

bool round_trip(int fd, const char* msg, size_t len) {
  if (write(fd, msg, len) != static_cast<ssize_t>(len)) return false;
  std::vector<unsigned char> got;
  return read_echo(fd, len, 5000, &got) >= 0 && memcmp(got.data(), msg, len) == 0;
}

// `close_range`: between two round trips the connection's descriptor is
// passed to close_range(), which must fail with ENOSYS (run under
// seccomp_run --enosys close_range, as on a kernel before 5.9) and leave
// the connection working.
int run_control(int port, bool close_range_enosys) {
  int fd = connect_to(port);
  const char msg[] = "control";
  if (!round_trip(fd, msg, sizeof msg)) {
    printf("FAIL control: no echo\n");
    return 1;
  }
  if (close_range_enosys) {
    int r = close_range(static_cast<unsigned>(fd), static_cast<unsigned>(fd), 0);
    if (r != -1 || errno != ENOSYS) {
      printf("FAIL control: close_range returned %d (%s), expected ENOSYS\n", r, strerror(errno));
      return 1;
    }
    const char again[] = "still here after close_range";
    if (!round_trip(fd, again, sizeof again)) {
      printf("FAIL control: the connection broke after a failed close_range\n");
      return 1;
    }
  }
  close(fd);
  printf("ok control\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "server" && argc == 4) return run_server(argv[2], argv[3]);
  if (mode == "client" && argc == 5) return run_client(atoi(argv[2]), atoi(argv[3]), atof(argv[4]));
  if (mode == "control" && (argc == 3 || (argc == 4 && strcmp(argv[3], "close-range") == 0))) {
    return run_control(atoi(argv[2]), argc == 4);
  }
  fprintf(stderr,
          "usage: hello_edge server MODEL PORTFILE | client PORT PID TIMEOUT_MS | control PORT [close-range]\n");
  return 2;
}
