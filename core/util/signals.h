// Whether a blocking call that our own poll() turned into EINTR would have
// been restarted by the kernel (SA_RESTART). poll() itself is never
// restarted, recv() on a socket without a timeout is; we cannot tell which
// signal arrived, so we restart only if every caught signal asks for it.
// Fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP) are left out: the
// thread's own instruction raises them, never a blocked call, and crash
// handlers (and sanitizer runtimes) rarely set SA_RESTART.
#pragma once

#include <signal.h>

namespace rdmashim {

inline bool signals_restart() {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP) continue;
    struct sigaction sa;
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    bool caught = (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != nullptr
                                             : (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN);
    if (caught && !(sa.sa_flags & SA_RESTART)) return false;
  }
  return true;
}

}  // namespace rdmashim
