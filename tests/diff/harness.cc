// The scenario framework (see harness.h) and main():
//
//   diff_scenarios NAME                 runs one scenario, prints its transcript
//   diff_scenarios --list               "name min_shm max_tcp" per scenario
//   diff_scenarios --post-exec MODE ... (internal: the exec scenarios' re-exec)
//
// main() is the collector: it forks the scenario's root process (a process
// group of its own), gathers the transcript lines of every process of the
// scenario from a SOCK_SEQPACKET socket they all inherit, and prints them
// when the last holder is gone, or reports a hang after kCollectS seconds.
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

extern char** environ;

namespace diff {
namespace {

constexpr int kCollectS = 20;  // the collector's bound for the whole scenario
constexpr int kReapMs = 12000;  // a child not gone by then is reported hung

struct Scenario {
  std::string name;
  int min_shm, max_tcp;
  ScenarioFn fn;
};
std::vector<Scenario>& scenarios() {
  static std::vector<Scenario> v;
  return v;
}
std::map<std::string, ExecModeFn>& exec_modes() {
  static std::map<std::string, ExecModeFn> m;
  return m;
}

int g_results = -1;  // the write end of the results socket
thread_local std::string t_role = "root";
uint64_t g_alarm_at = 0;  // when this process's alarm fires (ms, now_ms clock)

void arm_alarm(unsigned s) {
  alarm(s);
  g_alarm_at = now_ms() + s * 1000ull;
}

// A bound for waiting on another process: `ms` from now, but ending early
// enough that this process can still report (before its own alarm).
uint64_t bound_end(uint64_t ms) {
  uint64_t end = now_ms() + ms;
  if (g_alarm_at && g_alarm_at > 2500 && end > g_alarm_at - 2500) end = g_alarm_at - 2500;
  return end;
}

void send_msg(const std::string& m) {
  if (g_results < 0) return;
  for (;;) {
    ssize_t n = send(g_results, m.data(), m.size(), MSG_NOSIGNAL);
    if (n >= 0 || errno != EINTR) break;
  }
  if (getenv("DIFF_TRACE")) {
    std::string copy = m;
    std::replace(copy.begin(), copy.end(), '\x1f', ' ');
    copy += "\n";
    ssize_t ignored = write(2, copy.data(), copy.size());
    (void)ignored;
  }
}

void hello() { send_msg("H" + std::to_string(getpid())); }

}  // namespace

Registrar::Registrar(const char* name, int min_shm, int max_tcp, ScenarioFn fn) {
  scenarios().push_back({name, min_shm, max_tcp, fn});
}
ExecModeRegistrar::ExecModeRegistrar(const char* name, ExecModeFn fn) { exec_modes()[name] = fn; }

// ---- transcript --------------------------------------------------------------

void set_role(const std::string& r) { t_role = r; }
const std::string& role() { return t_role; }

static void vline(const char* prefix, const char* fmt, va_list ap) {
  char buf[4096];
  vsnprintf(buf, sizeof buf, fmt, ap);
  send_msg("L" + std::to_string(getpid()) + "\x1f" + t_role + "\x1f" + prefix + buf);
}

void T(const char* fmt, ...) {
  int saved = errno;
  va_list ap;
  va_start(ap, fmt);
  vline("", fmt, ap);
  va_end(ap);
  errno = saved;
}

void fatal(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vline("FATAL: ", fmt, ap);
  va_end(ap);
  finish(1);
}

const char* ename(int e) {
  const char* n = strerrorname_np(e);
  static thread_local char buf[32];
  if (!n) {
    snprintf(buf, sizeof buf, "errno%d", e);
    n = buf;
  }
  return n;
}

std::string E(long r) {
  int e = errno;
  if (r < 0) return std::to_string(r) + " " + ename(e);
  return std::to_string(r);
}

static std::string bits(uint32_t v, const std::vector<std::pair<uint32_t, const char*>>& names) {
  if (v == 0) return "0";
  std::string s;
  for (auto& [bit, name] : names) {
    if (v & bit) {
      if (!s.empty()) s += "|";
      s += name;
      v &= ~bit;
    }
  }
  if (v) {
    char b[32];
    snprintf(b, sizeof b, "%s0x%x", s.empty() ? "" : "|", v);
    s += b;
  }
  return s;
}

std::string pollev(short revents) {
  static const std::vector<std::pair<uint32_t, const char*>> names = {
      {POLLIN, "POLLIN"},         {POLLPRI, "POLLPRI"},         {POLLOUT, "POLLOUT"},
      {POLLERR, "POLLERR"},       {POLLHUP, "POLLHUP"},         {POLLNVAL, "POLLNVAL"},
      {POLLRDNORM, "POLLRDNORM"}, {POLLRDBAND, "POLLRDBAND"},   {POLLWRNORM, "POLLWRNORM"},
      {POLLWRBAND, "POLLWRBAND"}, {POLLRDHUP, "POLLRDHUP"}};
  return bits(static_cast<uint16_t>(revents), names);
}

std::string epollev(uint32_t ev) {
  static const std::vector<std::pair<uint32_t, const char*>> names = {
      {EPOLLIN, "EPOLLIN"},         {EPOLLPRI, "EPOLLPRI"},       {EPOLLOUT, "EPOLLOUT"},
      {EPOLLERR, "EPOLLERR"},       {EPOLLHUP, "EPOLLHUP"},       {EPOLLRDNORM, "EPOLLRDNORM"},
      {EPOLLRDBAND, "EPOLLRDBAND"}, {EPOLLWRNORM, "EPOLLWRNORM"}, {EPOLLWRBAND, "EPOLLWRBAND"},
      {EPOLLMSG, "EPOLLMSG"},       {EPOLLRDHUP, "EPOLLRDHUP"}};
  return bits(ev, names);
}

std::string yes(bool b) { return b ? "yes" : "no"; }

std::string quote(const void* p, size_t n) {
  std::string s = "\"";
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (c[i] >= 0x20 && c[i] < 0x7f && c[i] != '"' && c[i] != '\\') {
      s += static_cast<char>(c[i]);
    } else {
      char b[8];
      snprintf(b, sizeof b, "\\x%02x", c[i]);
      s += b;
    }
  }
  return s + "\"";
}

// ---- processes ---------------------------------------------------------------

pid_t xfork() {
  pid_t pid = fork();
  if (pid == 0) {
    arm_alarm(kProcessAlarmS);
    hello();
  }
  return pid;
}

pid_t spawn(const std::string& r, const std::function<void()>& fn) {
  pid_t pid = xfork();
  if (pid < 0) fatal("fork: %s", ename(errno));
  if (pid == 0) {
    set_role(r);
    fn();
    finish(0);
  }
  return pid;
}

void reap(pid_t pid, const char* what) {
  int status = 0;
  uint64_t end = bound_end(kReapMs);
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      T("%s: waitpid %s", what, ename(errno));
      return;
    }
    if (now_ms() > end) {
      T("%s HANG: still running, killed", what);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return;
    }
    sleep_ms(2);
  }
  if (WIFEXITED(status)) {
    T("%s exit=%d", what, WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    const char* n = sigabbrev_np(WTERMSIG(status));
    T("%s killed by SIG%s", what, n ? n : "?");
  } else {
    T("%s status=0x%x", what, status);
  }
}

void finish(int code) {
  send_msg("B" + std::to_string(getpid()));
  _exit(code);
}

void reexec(const char* mode, const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv_s = {"/proc/self/exe", "--post-exec", mode};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    if (strncmp(*e, "DIFF_RESULTS_FD=", 16) != 0) env_s.push_back(*e);
  }
  env_s.push_back("DIFF_RESULTS_FD=" + std::to_string(g_results));
  env_s.insert(env_s.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) fatal("readlink /proc/self/exe: %s", ename(errno));
  exe[n] = '\0';
  execve(exe, argv.data(), envp.data());
  fatal("execve: %s", ename(errno));
}

// ---- time ---------------------------------------------------------------------

uint64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

void sleep_ms(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// ---- sockets ----------------------------------------------------------------

int make_listener(uint16_t* port, int type_flags, int backlog) {
  int fd = socket(AF_INET, SOCK_STREAM | type_flags, 0);
  if (fd < 0) fatal("socket: %s", ename(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fatal("bind: %s", ename(errno));
  if (listen(fd, backlog) != 0) fatal("listen: %s", ename(errno));
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int connect_to(uint16_t port, int type_flags) {
  int fd = socket(AF_INET, SOCK_STREAM | type_flags, 0);
  if (fd < 0) fatal("socket: %s", ename(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) fatal("connect: %s", ename(errno));
    // A non-blocking socket: wait for the connection the way a program would.
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, kBoundMs) != 1) fatal("connect: not connected within bound");
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) fatal("connect: SO_ERROR %s", ename(err));
  }
  return fd;
}

int accept_one(int lfd, int flags) {
  for (;;) {
    int fd = accept4(lfd, nullptr, nullptr, flags);
    if (fd >= 0) return fd;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      pollfd p{lfd, POLLIN, 0};
      if (poll(&p, 1, kBoundMs) != 1) fatal("accept: nothing within bound");
      continue;
    }
    fatal("accept: %s", ename(errno));
  }
}

static void wait_io(int fd, short events, uint64_t end, const char* what) {
  if (now_ms() > end) fatal("%s: timed out", what);
  pollfd p{fd, events, 0};
  poll(&p, 1, 100);
}

void read_exact(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  uint64_t end = now_ms() + 2 * kBoundMs;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      fatal("read_exact: EOF with %zu bytes missing", n);
    } else if (errno == EAGAIN) {
      wait_io(fd, POLLIN, end, "read_exact");
    } else if (errno != EINTR) {
      fatal("read_exact: %s", ename(errno));
    }
  }
}

void write_all(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  uint64_t end = now_ms() + 2 * kBoundMs;
  while (n > 0) {
    ssize_t r = write(fd, p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && errno == EAGAIN) {
      wait_io(fd, POLLOUT, end, "write_all");
    } else if (r < 0 && errno != EINTR) {
      fatal("write_all: %s", ename(errno));
    }
  }
}

uint64_t read_to_eof(int fd, uint64_t* sum) {
  char buf[65536];
  uint64_t total = 0, h = kFnvInit, end = now_ms() + 2 * kBoundMs;
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r > 0) {
      h = fnv(h, buf, static_cast<size_t>(r));
      total += static_cast<uint64_t>(r);
    } else if (r == 0) {
      break;
    } else if (errno == EAGAIN) {
      wait_io(fd, POLLIN, end, "read_to_eof");
    } else if (errno != EINTR) {
      T("read_to_eof: %s after %llu bytes", ename(errno), static_cast<unsigned long long>(total));
      break;
    }
  }
  if (sum) *sum = h;
  return total;
}

void warm_server(int fd) {
  char b[2];
  read_exact(fd, b, 2);
  write_all(fd, "W1", 2);
  read_exact(fd, b, 2);
  write_all(fd, "W2", 2);
}

void warm_client(int fd) {
  char b[2];
  write_all(fd, "w1", 2);
  read_exact(fd, b, 2);
  write_all(fd, "w2", 2);
  read_exact(fd, b, 2);
}

short poll_until(int fd, short events, short want, int bound_ms) {
  uint64_t end = now_ms() + static_cast<uint64_t>(bound_ms);
  short last = 0;
  for (;;) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, 50);
    last = r > 0 ? p.revents : 0;
    if (last & want) return last;
    if (now_ms() >= end) return last;
  }
}

uint32_t epoll_until(int ep, uint64_t data, uint32_t want, int bound_ms) {
  uint64_t end = now_ms() + static_cast<uint64_t>(bound_ms);
  for (;;) {
    epoll_event ev[16];
    int n = epoll_wait(ep, ev, 16, 50);
    uint32_t seen = 0;
    for (int i = 0; i < n; ++i)
      if (ev[i].data.u64 == data) seen |= ev[i].events;
    if (seen & want) return seen;
    if (now_ms() >= end) return seen;
  }
}

void fill_pattern(uint64_t seed, uint64_t offset, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = pattern(seed, offset + i);
}

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t pattern_sum(uint64_t seed, uint64_t n) {
  uint64_t h = kFnvInit;
  uint8_t buf[4096];
  for (uint64_t off = 0; off < n;) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(sizeof buf, n - off));
    fill_pattern(seed, off, buf, k);
    h = fnv(h, buf, k);
    off += k;
  }
  return h;
}

namespace {
struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
};
}  // namespace

uint64_t send_stream(int fd, uint64_t seed, uint64_t n) {
  std::vector<uint8_t> buf(65536);
  Lcg rng{seed};
  uint64_t h = kFnvInit;
  for (uint64_t off = 0; off < n;) {
    size_t k = 1 + rng.next() % buf.size();
    if (k > n - off) k = static_cast<size_t>(n - off);
    fill_pattern(seed, off, buf.data(), k);
    write_all(fd, buf.data(), k);
    h = fnv(h, buf.data(), k);
    off += k;
  }
  return h;
}

uint64_t recv_stream(int fd, uint64_t seed, uint64_t n) {
  std::vector<uint8_t> buf(65536);
  Lcg rng{seed ^ 0x5555};
  uint64_t h = kFnvInit;
  uint64_t end = now_ms() + 2 * kBoundMs;
  for (uint64_t off = 0; off < n;) {
    size_t k = 1 + rng.next() % buf.size();
    if (k > n - off) k = static_cast<size_t>(n - off);
    ssize_t r = read(fd, buf.data(), k);
    if (r > 0) {
      h = fnv(h, buf.data(), static_cast<size_t>(r));
      off += static_cast<uint64_t>(r);
    } else if (r == 0) {
      T("recv_stream: EOF after %llu of %llu bytes", static_cast<unsigned long long>(off),
        static_cast<unsigned long long>(n));
      return h;
    } else if (errno == EAGAIN) {
      wait_io(fd, POLLIN, end, "recv_stream");
    } else if (errno != EINTR) {
      T("recv_stream: %s after %llu of %llu bytes", ename(errno), static_cast<unsigned long long>(off),
        static_cast<unsigned long long>(n));
      return h;
    }
  }
  return h;
}

// ---- control channel --------------------------------------------------------

static void ctl_read(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  uint64_t end = bound_end(kReapMs);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int left = static_cast<int>(end > now_ms() ? end - now_ms() : 0);
    int pr = poll(&pf, 1, left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) fatal("ctl: the other end did not arrive in time (hung?)");
    ssize_t r = read(fd, p, n);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) fatal("ctl: the other end is gone");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

static void ctl_write(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fatal("ctl: write failed: %s", ename(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void Ctl::sync() {
  char c = 'S';
  ctl_write(fd, &c, 1);
  ctl_read(fd, &c, 1);
  if (c != 'S') fatal("ctl: out of step (got a value where a barrier was expected)");
}

void Ctl::put(uint64_t v) {
  char b[9] = {'V'};
  memcpy(b + 1, &v, 8);
  ctl_write(fd, b, 9);
}

uint64_t Ctl::get() {
  char b[9];
  ctl_read(fd, b, 9);
  if (b[0] != 'V') fatal("ctl: out of step (got a barrier where a value was expected)");
  uint64_t v;
  memcpy(&v, b + 1, 8);
  return v;
}

void make_ctl(Ctl* a, Ctl* b) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) fatal("socketpair: %s", ename(errno));
  a->fd = sv[0];
  b->fd = sv[1];
}

void run_pair(const std::function<void(Pair&)>& server, const std::function<void(Pair&)>& client, PairOpts opts) {
  set_role("server");
  Pair s, c;
  s.lfd = make_listener(&s.port);
  c.port = s.port;
  make_ctl(&s.ctl, &c.ctl);
  pid_t pid = spawn("client", [&] {
    close(s.ctl.fd);
    close(s.lfd);
    c.fd = connect_to(c.port, opts.socket_flags);
    if (opts.warm) warm_client(c.fd);
    client(c);
  });
  close(c.ctl.fd);
  s.fd = accept_one(s.lfd, opts.accept_flags);
  if (opts.warm) warm_server(s.fd);
  server(s);
  reap(pid, "client");
}

}  // namespace diff

// ---- main: the collector -------------------------------------------------------

using namespace diff;

namespace {

struct Line {
  std::string role, text;
};

int collect(const char* name, pid_t root, int rfd) {
  std::vector<Line> lines;
  std::map<pid_t, std::string> open;  // pid -> last role seen
  uint64_t end = now_ms() + kCollectS * 1000ull;
  bool hang = false;
  std::vector<char> buf(1 << 16);
  for (;;) {
    uint64_t now = now_ms();
    if (now >= end) {
      hang = true;
      break;
    }
    pollfd p{rfd, POLLIN, 0};
    int pr = poll(&p, 1, static_cast<int>(end - now));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) continue;
    ssize_t n = recv(rfd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // every process of the scenario is gone
    std::string m(buf.data(), static_cast<size_t>(n));
    char kind = m[0];
    if (kind == 'H') {
      open[static_cast<pid_t>(atoi(m.c_str() + 1))] = "?";
    } else if (kind == 'B') {
      open.erase(static_cast<pid_t>(atoi(m.c_str() + 1)));
    } else if (kind == 'L') {
      size_t a = m.find('\x1f'), b = m.find('\x1f', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      pid_t pid = static_cast<pid_t>(atoi(m.substr(1, a - 1).c_str()));
      Line l{m.substr(a + 1, b - a - 1), m.substr(b + 1)};
      open[pid] = l.role;
      lines.push_back(std::move(l));
    }
  }
  if (hang) {
    kill(-root, SIGKILL);
    for (auto& [pid, r] : open) kill(pid, SIGKILL);
  }
  int status = 0;
  uint64_t wend = now_ms() + 3000;
  bool reaped = false;
  while (now_ms() < wend) {
    if (waitpid(root, &status, WNOHANG) == root) {
      reaped = true;
      break;
    }
    sleep_ms(5);
  }
  if (!reaped) {
    kill(-root, SIGKILL);
    waitpid(root, &status, 0);
  }

  std::stable_sort(lines.begin(), lines.end(), [](const Line& x, const Line& y) { return x.role < y.role; });
  printf("scenario %s\n", name);
  for (auto& l : lines) printf("[%s] %s\n", l.role.c_str(), l.text.c_str());
  if (WIFEXITED(status)) {
    printf("root exit=%d\n", WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    const char* n = sigabbrev_np(WTERMSIG(status));
    printf("root killed by SIG%s\n", n ? n : "?");
  }
  if (hang) {
    std::set<std::string> roles;
    for (auto& [pid, r] : open) roles.insert(r);
    std::string list;
    for (auto& r : roles) list += (list.empty() ? "" : ", ") + r;
    printf("HANG: the scenario did not end within %d s; unfinished: %s\n", kCollectS, list.c_str());
  }
  fflush(stdout);
  return hang ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc >= 2 && strcmp(argv[1], "--list") == 0) {
    auto v = scenarios();
    std::sort(v.begin(), v.end(), [](const Scenario& a, const Scenario& b) { return a.name < b.name; });
    for (auto& s : v) printf("%s %d %d\n", s.name.c_str(), s.min_shm, s.max_tcp);
    return 0;
  }
  if (argc >= 3 && strcmp(argv[1], "--post-exec") == 0) {
    const char* rf = getenv("DIFF_RESULTS_FD");
    g_results = rf ? atoi(rf) : -1;
    unsetenv("DIFF_RESULTS_FD");
    unsigned left = alarm(0);  // execve kept the alarm: keep it, and know when
    arm_alarm(left ? left : kProcessAlarmS);
    auto it = exec_modes().find(argv[2]);
    if (it == exec_modes().end()) {
      T("unknown exec mode %s", argv[2]);
      finish(2);
    }
    it->second(argc - 3, argv + 3);
    finish(0);
  }
  if (argc != 2) {
    fprintf(stderr, "usage: %s NAME | --list\n", argv[0]);
    return 2;
  }
  const Scenario* sc = nullptr;
  for (auto& s : scenarios())
    if (s.name == argv[1]) sc = &s;
  if (!sc) {
    fprintf(stderr, "%s: no scenario %s (see --list)\n", argv[0], argv[1]);
    return 2;
  }
  int rs[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, rs) != 0) {
    perror("socketpair");
    return 2;
  }
  // A large receive buffer: lines are small but some scenarios write many.
  int big = 4 << 20;
  setsockopt(rs[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  fflush(stdout);
  pid_t root = fork();
  if (root < 0) {
    perror("fork");
    return 2;
  }
  if (root == 0) {
    setpgid(0, 0);
    close(rs[0]);
    g_results = rs[1];
    arm_alarm(kProcessAlarmS);
    hello();
    set_role("main");
    sc->fn();
    finish(0);
  }
  setpgid(root, root);
  close(rs[1]);
  return collect(sc->name.c_str(), root, rs[0]);
}
