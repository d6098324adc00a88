// What every scenario source includes: the harness and the socket API.
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"

namespace diff {

// "n=2 [EPOLLIN u64=0x1] [EPOLLOUT u64=0x2]", entries sorted by data, so the
// kernel's ready-list order (not part of the contract) does not matter.
inline std::string evs(int n, const epoll_event* ev) {
  if (n < 0) return E(n);
  std::vector<std::pair<uint64_t, uint32_t>> v;
  for (int i = 0; i < n; ++i) v.push_back({ev[i].data.u64, ev[i].events});
  std::sort(v.begin(), v.end());
  std::string s = "n=" + std::to_string(n);
  for (auto& [d, e] : v) {
    char b[40];
    snprintf(b, sizeof b, " u64=0x%llx]", static_cast<unsigned long long>(d));
    s += " [" + epollev(e) + b;
  }
  return s;
}

// "1 POLLIN" / "0" / "-1 EINTR": a poll result with the revents of one fd.
inline std::string pres(int r, const pollfd& p) {
  if (r < 0) return E(r);
  return std::to_string(r) + " " + pollev(p.revents);
}

// A data call's result with the bytes it got: "5 \"hello\"", "0", "-1 EAGAIN".
// Call right after the call (reads errno).
inline std::string Rn(long n, const void* buf) {
  std::string r = E(n);
  if (n > 0) r += " " + quote(buf, static_cast<size_t>(n));
  return r;
}

inline int set_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}
inline bool is_nonblock(int fd) { return (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }
inline bool is_cloexec(int fd) { return (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; }

inline int epoll_add(int ep, int fd, uint32_t events, uint64_t data) {
  epoll_event e{};
  e.events = events;
  e.data.u64 = data;
  return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
}
inline int epoll_mod(int ep, int fd, uint32_t events, uint64_t data) {
  epoll_event e{};
  e.events = events;
  e.data.u64 = data;
  return epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e);
}

// A counting handler for `sig`; with or without SA_RESTART.
inline std::atomic<int>& sig_count(int sig) {
  static std::atomic<int> counts[65];
  return counts[sig];
}
inline void count_handler(int sig) { sig_count(sig).fetch_add(1); }
inline void install_counter(int sig, bool restart) {
  struct sigaction sa {};
  sa.sa_handler = count_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = restart ? SA_RESTART : 0;
  sigaction(sig, &sa, nullptr);
}

inline pid_t tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Waits (bounded) until thread `t` of this process sleeps, then a little
// more: used to send a signal while a call is really blocked in the kernel.
inline void until_sleeping(pid_t t) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", t);
  uint64_t end = now_ms() + kBoundMs;
  while (now_ms() < end) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    size_t rp = s.rfind(')');
    if (rp != std::string::npos && rp + 2 < s.size() && s[rp + 2] == 'S') {
      sleep_ms(20);
      return;
    }
    sleep_ms(1);
  }
}

}  // namespace diff
