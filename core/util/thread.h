// rdmashim's own background threads (RDMA-CM answers, verbs heartbeat, the
// device watchdog): detached, with every signal blocked so the application's
// signals are never delivered to them, and a small stack.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace rdmashim {

inline bool start_background_thread(void* (*fn)(void*), void* arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // inherited by the new thread
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  pthread_t t;
  bool ok = pthread_create(&t, &attr, fn, arg) == 0;
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok;
}

}  // namespace rdmashim
