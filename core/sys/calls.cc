#include "sys/calls.h"

#include <sys/select.h>

#include <atomic>
#include <cerrno>

#include "sys/sys.h"

namespace rdmashim::sys {
namespace {

std::atomic<WaitCall> g_wait{WaitCall::kPoll};

struct Current {
  Calls calls = Calls::kMsg;
  bool sigpipe_ok = false;
  bool raised = false;
};
thread_local Current t_current;

int select_wait(bool pselect, pollfd* fds, nfds_t n, int timeout_ms, const sigset_t* mask) {
  fd_set r, w, e;
  FD_ZERO(&r);
  FD_ZERO(&w);
  FD_ZERO(&e);
  int top = -1;
  for (nfds_t i = 0; i < n; ++i) {
    fds[i].revents = 0;
    int fd = fds[i].fd;
    if (fd < 0) continue;
    if (fd >= FD_SETSIZE) return wait_as(mask ? WaitCall::kPpoll : WaitCall::kPoll, fds, n, timeout_ms, mask);
    if (fds[i].events & (POLLIN | POLLRDNORM)) FD_SET(fd, &r);
    if (fds[i].events & (POLLOUT | POLLWRNORM)) FD_SET(fd, &w);
    if (fds[i].events & POLLPRI) FD_SET(fd, &e);
    if (fd > top) top = fd;
  }
  int got;
  if (pselect) {
    timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1'000'000L};
    got = real().pselect(top + 1, &r, &w, &e, timeout_ms < 0 ? nullptr : &ts, mask);
  } else {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000L};
    got = real().select(top + 1, &r, &w, &e, timeout_ms < 0 ? nullptr : &tv);
  }
  if (got <= 0) return got;
  int count = 0;
  for (nfds_t i = 0; i < n; ++i) {
    int fd = fds[i].fd;
    if (fd < 0) continue;
    if (FD_ISSET(fd, &r)) fds[i].revents |= POLLIN;
    if (FD_ISSET(fd, &w)) fds[i].revents |= POLLOUT;
    if (FD_ISSET(fd, &e)) fds[i].revents |= POLLPRI;
    count += fds[i].revents != 0;
  }
  return count;
}

}  // namespace

void note_wait_call(WaitCall w) {
  if (g_wait.load(std::memory_order_relaxed) != w) g_wait.store(w, std::memory_order_relaxed);
}
WaitCall wait_call() { return g_wait.load(std::memory_order_relaxed); }

int wait_as(WaitCall how, pollfd* fds, nfds_t n, int timeout_ms, const sigset_t* mask) {
  switch (how) {
    case WaitCall::kPpoll: {
      timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1'000'000L};
      return real().ppoll(fds, n, timeout_ms < 0 ? nullptr : &ts, mask);
    }
    case WaitCall::kSelect:
    case WaitCall::kPselect:
      return select_wait(how == WaitCall::kPselect, fds, n, timeout_ms, mask);
    case WaitCall::kPoll:
      break;
  }
  return real().poll(fds, n, timeout_ms);
}

int wait(pollfd* fds, nfds_t n, int timeout_ms) { return wait_as(wait_call(), fds, n, timeout_ms); }

CallScope::CallScope(Calls calls, bool sigpipe_ok)
    : saved_calls_(t_current.calls), saved_sigpipe_ok_(t_current.sigpipe_ok), saved_raised_(t_current.raised) {
  t_current = {calls, sigpipe_ok, false};
}

CallScope::~CallScope() { t_current = {saved_calls_, saved_sigpipe_ok_, saved_raised_}; }

Calls current_calls() { return t_current.calls; }
bool sigpipe_ok() { return t_current.sigpipe_ok; }
bool sigpipe_raised() { return t_current.raised; }
void note_sigpipe_raised() { t_current.raised = true; }

}  // namespace rdmashim::sys
