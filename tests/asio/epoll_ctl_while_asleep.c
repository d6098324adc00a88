// epoll_ctl from one thread while another sleeps in epoll_wait on the set, on
// a connection that already moved its bytes (so under rdmashim it is on its
// rings): asio runs its reactor in one thread and registers sockets, or
// re-arms them, from the others. Natively the kernel's epoll_ctl covers the
// sleeper: the bytes the peer sends afterwards wake it. Three ways in:
//   add:    the socket is added while the sleeper sleeps;
//   mod:    it was in the set for EPOLLOUT, and is switched to EPOLLIN;
//   nested: it is added to a set nested in the one the sleeper waits on;
//   oneshot: its EPOLLONESHOT registration fired, and is re-armed (a thread
//            pool's worker hands the socket back to the event thread).
// Then the peer writes; the sleeper must report it at once: within 2 s of
// its 5 s wait (a sleeper that missed it wakes only when the wait ends).
// usage: epoll_ctl_while_asleep add|mod|nested|oneshot. Exits 0 when it did.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "loopback_pair.h"

static int g_ep;
static int g_n = -1;
static struct epoll_event g_got;
static double g_ms;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void* sleeper(void* arg) {
  (void)arg;
  double start = now_ms();
  g_n = epoll_wait(g_ep, &g_got, 1, 5000);
  g_ms = now_ms() - start;
  return NULL;
}

// Blocking exchanges each way, so both directions carry bytes first (under
// rdmashim the first ones settle the handshake and move each direction
// onto its ring).
static int exchange(int a, int b) {
  char buf[8];
  for (int i = 0; i < 3; ++i) {
    if (send(a, "ping", 4, MSG_NOSIGNAL) != 4 || recv(b, buf, 4, MSG_WAITALL) != 4 ||
        send(b, "pong", 4, MSG_NOSIGNAL) != 4 || recv(a, buf, 4, MSG_WAITALL) != 4)
      return -1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* how = argc > 1 ? argv[1] : "";
  int add = !strcmp(how, "add"), mod = !strcmp(how, "mod"), nested = !strcmp(how, "nested");
  int oneshot = !strcmp(how, "oneshot");
  if (!add && !mod && !nested && !oneshot)
    return fprintf(stderr, "usage: epoll_ctl_while_asleep add|mod|nested|oneshot\n"), 2;
  int l, c;
  if (loopback_pair(&l, &c) != 0) return perror("listen/connect"), 2;
  int s = accept(l, NULL, NULL);
  if (s < 0 || exchange(c, s) != 0) return perror("accept/exchange"), 2;
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);

  // The sleeper's set holds something of the program's own (asio's
  // interrupter), never signalled here.
  g_ep = epoll_create1(EPOLL_CLOEXEC);
  int quiet = eventfd(0, EFD_NONBLOCK);
  struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 1};
  epoll_ctl(g_ep, EPOLL_CTL_ADD, quiet, &ev);
  int inner = -1;
  if (nested) {
    inner = epoll_create1(EPOLL_CLOEXEC);
    ev = (struct epoll_event){.events = EPOLLIN, .data.u64 = 2};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, inner, &ev);
  }
  if (mod) {  // in the set for EPOLLOUT, reported once (writable) before the sleep
    ev = (struct epoll_event){.events = EPOLLOUT | EPOLLET, .data.u64 = 7};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, s, &ev);
    struct epoll_event first;
    int n = epoll_wait(g_ep, &first, 1, 1000);
    if (n != 1 || first.data.u64 != 7 || !(first.events & EPOLLOUT))
      return printf("FAIL: the writable socket was not reported (%d)\n", n), 1;
  }

  uint32_t rearm = EPOLLIN | EPOLLET;
  if (oneshot) {  // fired once (a byte read) before the sleep
    rearm = EPOLLIN | EPOLLONESHOT;
    ev = (struct epoll_event){.events = rearm, .data.u64 = 7};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, s, &ev);
    send(c, "x", 1, MSG_NOSIGNAL);
    struct epoll_event first;
    char x;
    int n = epoll_wait(g_ep, &first, 1, 1000);
    if (n != 1 || first.data.u64 != 7 || recv(s, &x, 1, 0) != 1)
      return printf("FAIL: the first byte was not reported (%d)\n", n), 1;
  }

  pthread_t t;
  pthread_create(&t, NULL, sleeper, NULL);
  usleep(100000);  // asleep by now
  ev = (struct epoll_event){.events = rearm, .data.u64 = 7};
  int rc = epoll_ctl(nested ? inner : g_ep, mod || oneshot ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, &ev);
  if (rc != 0) return printf("FAIL: epoll_ctl: %s\n", strerror(errno)), 1;
  usleep(50000);
  send(c, "data", 4, MSG_NOSIGNAL);  // the peer's bytes, after the epoll_ctl
  pthread_join(t, NULL);

  uint64_t want = nested ? 2 : 7;
  printf("%s: epoll_wait returned %d after %.1f ms, data %llu, events 0x%x (expected 1, data %llu, EPOLLIN)\n", how,
         g_n, g_ms, (unsigned long long)(g_n == 1 ? g_got.data.u64 : 0), g_n == 1 ? g_got.events : 0,
         (unsigned long long)want);
  char buf[8];
  ssize_t r = recv(s, buf, sizeof buf, 0);
  int ok = g_n == 1 && g_got.data.u64 == want && (g_got.events & EPOLLIN) && r == 4 && g_ms < 2000;
  printf("%s\n", ok ? "ok" : "FAIL: the peer's bytes came after epoll_ctl and the sleeper never heard of them");
  return ok ? 0 : 1;
}
