#include "util/user_copy.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include <cstdint>
#include <cstring>

namespace rdmashim {
namespace {

struct Guard {
  sigjmp_buf env;
  uintptr_t lo = 0, hi = 0;
  volatile bool armed = false;
};
thread_local Guard t_guard;

struct sigaction g_prev_segv, g_prev_bus;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void on_fault(int sig, siginfo_t* si, void* ctx) {
  Guard& g = t_guard;
  uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  // A fault of the kernel's making (not a kill) on the range we are copying;
  // a non-canonical pointer faults with address 0 (SI_KERNEL).
  bool ours = g.armed && si->si_code > 0 && ((a >= g.lo && a < g.hi) || si->si_code == SI_KERNEL);
  if (ours) {
    g.armed = false;
    siglongjmp(g.env, 1);
  }
  const struct sigaction& prev = sig == SIGSEGV ? g_prev_segv : g_prev_bus;
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, si, ctx);
    return;
  }
  if (prev.sa_handler == SIG_IGN && si->si_code <= 0) return;
  if (prev.sa_handler == SIG_DFL || prev.sa_handler == SIG_IGN) {
    // Back to the default: the faulting instruction runs again and the
    // process dies as it would have without us.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, nullptr);
    if (si->si_code <= 0) raise(sig);
    return;
  }
  prev.sa_handler(sig);
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  // NODEFER: we leave with siglongjmp and do not save the mask (that would
  // cost a system call per copy). ONSTACK: a handler of the program's that
  // needs its alternate stack (stack overflow) still gets it.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_prev_segv);
  sigaction(SIGBUS, &sa, &g_prev_bus);
}

void do_memcpy(void* arg) {
  auto* a = static_cast<void**>(arg);
  memcpy(a[0], a[1], reinterpret_cast<size_t>(a[2]));
}

}  // namespace

void prepare_user_copy() { pthread_once(&g_once, install); }

__attribute__((noinline)) bool guarded_user_access(const void* user, size_t len, void (*fn)(void*), void* arg) {
  pthread_once(&g_once, install);
  Guard& g = t_guard;
  g.lo = reinterpret_cast<uintptr_t>(user);
  g.hi = g.lo + len;
  if (sigsetjmp(g.env, 0) != 0) return false;
  g.armed = true;
  fn(arg);
  g.armed = false;
  return true;
}

bool copy_user(void* dst, const void* src, size_t n, const void* user) {
  void* args[3] = {dst, const_cast<void*>(src), reinterpret_cast<void*>(n)};
  return guarded_user_access(user, n, do_memcpy, args);
}

}  // namespace rdmashim
