// The two ends of the idle-CPU test (run_idle.sh measures them from outside).
//
//   idle_peer server --port-file F
//       accepts one connection, echoes 64-byte messages; on SIGUSR1 sends a
//       64-byte "bye" message unprompted, then waits for EOF and exits
//   idle_peer client --port P --ready-file F [--wait epoll|poll|recv] [--rounds N]
//       connects, does N (20) checked round trips (so the connection is past
//       its handshake and on the ring), writes its pid to F, then waits for
//       the server's unprompted "bye" in epoll_wait (default), poll or a
//       blocking recv, bounded at 60 s; checks it, closes, and exits 0.
//       Prints how many times its wait returned with nothing to read.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr size_t kMsg = 64;
const char kBye[kMsg] = "bye: the server spoke first after the idle period";

bool read_full(int fd, char* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(fd, buf + done, len - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool write_full(int fd, const char* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = send(fd, buf + done, len - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) return;
  fputs(text.c_str(), f);
  fclose(f);
  rename(tmp.c_str(), path.c_str());
}

volatile sig_atomic_t g_bye = 0;
void on_usr1(int) { g_bye = 1; }

int run_server(const std::string& port_file) {
  struct sigaction sa {};
  sa.sa_handler = on_usr1;  // no SA_RESTART: the blocking recv returns EINTR
  sigaction(SIGUSR1, &sa, nullptr);
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 4) != 0) return perror("listen"), 2;
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  write_file(port_file, std::to_string(ntohs(a.sin_port)) + "\n");
  int fd = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return perror("accept"), 2;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char buf[kMsg];
  bool said_bye = false;
  for (;;) {
    if (g_bye && !said_bye) {
      if (!write_full(fd, kBye, kMsg)) return perror("idle_peer server: send bye"), 1;
      said_bye = true;
    }
    ssize_t n = recv(fd, buf, kMsg, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) break;  // the client closed
    if (n != static_cast<ssize_t>(kMsg)) return fprintf(stderr, "idle_peer server: recv %zd: %s\n", n, strerror(errno)), 1;
    if (!write_full(fd, buf, kMsg)) return perror("idle_peer server: send"), 1;
  }
  close(fd);
  close(l);
  return said_bye ? 0 : 1;
}

int run_client(uint16_t port, const std::string& ready_file, const std::string& wait, int rounds) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return perror("idle_peer client: connect"), 2;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char out[kMsg], in[kMsg];
  for (int i = 0; i < rounds; ++i) {
    snprintf(out, sizeof out, "round %d", i);
    if (!write_full(fd, out, kMsg) || !read_full(fd, in, kMsg) || memcmp(in, out, kMsg) != 0) {
      fprintf(stderr, "idle_peer client: round %d failed\n", i);
      return 1;
    }
  }

  int ep = -1;
  if (wait == "epoll") {
    ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0x1d1e;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) return perror("idle_peer client: epoll_ctl"), 1;
  }
  write_file(ready_file, std::to_string(getpid()) + "\n");

  // Idle: wait (bounded) for the server's unprompted message.
  timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int empty_wakeups = 0;
  for (;;) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int left_ms = 60000 - static_cast<int>((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
    if (left_ms <= 0) return fprintf(stderr, "idle_peer client: no message from the server in 60 s\n"), 1;
    if (wait == "recv") break;  // the blocking recv below is the wait
    int n = 0;
    if (wait == "epoll") {
      epoll_event got{};
      n = epoll_wait(ep, &got, 1, left_ms);
      if (n == 1 && (got.data.u64 != 0x1d1e || !(got.events & EPOLLIN))) {
        fprintf(stderr, "idle_peer client: epoll_wait returned events 0x%x data %llx\n", got.events,
                static_cast<unsigned long long>(got.data.u64));
        return 1;
      }
    } else {
      pollfd p{fd, POLLIN, 0};
      n = poll(&p, 1, left_ms);
    }
    if (n < 0 && errno != EINTR) return perror("idle_peer client: wait"), 1;
    if (n <= 0) continue;
    // Readable: is there really something?
    ssize_t peek = recv(fd, in, 1, MSG_PEEK | MSG_DONTWAIT);
    if (peek > 0) break;
    ++empty_wakeups;
  }
  if (!read_full(fd, in, kMsg) || memcmp(in, kBye, kMsg) != 0) {
    fprintf(stderr, "idle_peer client: expected the server's bye message\n");
    return 1;
  }
  printf("idle_peer client: woke up with the server's message (%s wait), empty wake-ups while idle: %d\n",
         wait.c_str(), empty_wakeups);
  close(fd);
  if (ep >= 0) close(ep);
  return empty_wakeups > 2 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: idle_peer server --port-file F | client --port P --ready-file F [--wait epoll|poll|recv]"
                    " [--rounds N]\n");
    return 2;
  }
  std::string role = argv[1], port_file, ready_file, wait = "epoll";
  uint16_t port = 0;
  int rounds = 20;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--port-file") port_file = argv[i + 1];
    else if (a == "--port") port = static_cast<uint16_t>(atoi(argv[i + 1]));
    else if (a == "--ready-file") ready_file = argv[i + 1];
    else if (a == "--wait") wait = argv[i + 1];
    else if (a == "--rounds") rounds = atoi(argv[i + 1]);
    else return fprintf(stderr, "idle_peer: unknown option %s\n", a.c_str()), 2;
  }
  if (wait != "epoll" && wait != "poll" && wait != "recv") return fprintf(stderr, "idle_peer: bad --wait\n"), 2;
  if (role == "server" && !port_file.empty()) return run_server(port_file);
  if (role == "client" && port && !ready_file.empty()) return run_client(port, ready_file, wait, rounds);
  fprintf(stderr, "idle_peer: missing options\n");
  return 2;
}
