// A thread already asleep on a socket (epoll_wait, or poll) whose peer's
// next bytes move it onto its ring, while another thread's non-blocking read
// takes those bytes first: asio's reactor sleeping while a handler makes a
// speculative read (asio_test hung this way about once in 150 runs).
// Natively the bytes' arrival wakes the sleeper; the kernel finds nothing
// readable any more (the read took it) and sleeps on, and the next bytes wake
// it again. Under rdmashim the first bytes are the peer's Switch, and the
// next ones land on the ring: the sleeper, asleep in the kernel since before
// the switch, never armed the ring, and slept to its timeout.
//
// Each round: a connection whose client side has no direction on its ring
// yet (the server answered before the client attached), and
//  - the waiter, on CPU 0 under SCHED_IDLE, asleep on the client (the set
//    holds it edge-triggered for input, or poll asks for POLLIN);
//  - a CPU hog on CPU 0, so that the waiter, woken by the Switch, runs only
//    after the reader (on CPU 1) took it: the race made certain;
//  - the client's next byte (its own Switch: nothing the waiter sees), then
//    the server's reply (its Switch and one byte), read by the reader;
//  - the hog stops, the waiter is a normal thread again, and the server's
//    second byte must wake it within 500 ms (its wait ends after 3 s).
// "-fresh": the waiter sleeps from before the client's first byte, so its
// socket has no doorbell yet; the reader takes the Ack and the server's
// first byte, then the Switch and the second.
//
// usage: switch_while_asleep epoll|poll|epoll-fresh|poll-fresh [ROUNDS (10)];
// exits 0 when every round did, 77 (skipped) on a machine with fewer than
// two CPUs.
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "loopback_pair.h"

static int g_poll_mode, g_fresh, g_ep, g_c;
static atomic_int g_waiter_tid, g_hog_on;
static int g_n;
static unsigned g_events;
static double g_woke_ms;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void* waiter(void* arg) {
  (void)arg;
  pin(0);
  struct sched_param p = {0};
  sched_setscheduler(0, SCHED_IDLE, &p);
  atomic_store(&g_waiter_tid, (int)syscall(SYS_gettid));
  if (g_poll_mode) {
    struct pollfd q = {.fd = g_c, .events = POLLIN};
    g_n = poll(&q, 1, 3000);
    g_events = (unsigned)q.revents;
  } else {
    struct epoll_event got = {0};
    g_n = epoll_wait(g_ep, &got, 1, 3000);
    g_events = got.events;
  }
  g_woke_ms = now_ms();
  return NULL;
}

static void* hog(void* arg) {
  (void)arg;
  pin(0);
  while (atomic_load_explicit(&g_hog_on, memory_order_relaxed)) {
  }
  return NULL;
}

static atomic_int g_reader_got;  // bytes the reader took so far
static int g_reader_wants;

static void* reader(void* arg) {
  (void)arg;
  pin(1);
  char b;
  double until = now_ms() + 2000;
  while (now_ms() < until && atomic_load(&g_reader_got) < g_reader_wants)
    if (recv(g_c, &b, 1, MSG_DONTWAIT) == 1) atomic_fetch_add(&g_reader_got, 1);
  return NULL;
}

static int reader_got(int n) {
  double until = now_ms() + 2000;
  while (atomic_load(&g_reader_got) < n && now_ms() < until) usleep(100);
  return atomic_load(&g_reader_got) >= n;
}

// Whether thread `tid` sleeps in a wait call (the kernel's, under our hooks too).
static int asleep_in_wait(int tid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char* paren = strrchr(buf, ')');
  if (!paren || paren[1] != ' ' || paren[2] != 'S') return 0;
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
  f = fopen(path, "r");
  if (!f) return 0;
  long nr = -1;
  if (fscanf(f, "%ld", &nr) != 1) nr = -1;
  fclose(f);
  return nr == SYS_poll || nr == SYS_ppoll || nr == SYS_epoll_wait || nr == SYS_epoll_pwait ||
         nr == SYS_epoll_pwait2;
}

static int round_once(int i) {
  int l, c, s = -1;
  char b;
  if (loopback_pair(&l, &c) != 0) return perror("listen/connect"), 2;
  if (!g_fresh) {
    // The client writes first and the server answers before the client
    // attached (Ack and reply framed on TCP): both client directions framed.
    if (send(c, "q", 1, MSG_NOSIGNAL) != 1) return perror("send"), 2;
    s = accept(l, NULL, NULL);
    if (s < 0 || recv(s, &b, 1, MSG_WAITALL) != 1 || send(s, "r", 1, MSG_NOSIGNAL) != 1) return perror("server"), 2;
    if (recv(c, &b, 1, MSG_WAITALL) != 1) return perror("client"), 2;
  }
  g_c = c;
  g_ep = -1;
  if (!g_poll_mode) {
    g_ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u64 = 7};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, c, &ev);
  }

  pthread_t w, h, r;
  atomic_store(&g_waiter_tid, 0);
  pthread_create(&w, NULL, waiter, NULL);
  int tid;
  while ((tid = atomic_load(&g_waiter_tid)) == 0) usleep(100);
  for (int seen = 0; seen < 3;) {  // asleep, and still asleep a few ms later
    usleep(2000);
    seen = asleep_in_wait(tid) ? seen + 1 : 0;
  }
  atomic_store(&g_hog_on, 1);
  pthread_create(&h, NULL, hog, NULL);
  usleep(2000);  // the hog holds CPU 0
  atomic_store(&g_reader_got, 0);
  g_reader_wants = g_fresh ? 2 : 1;
  if (g_fresh) {
    // The whole handshake under the waiter: the client's first byte (its
    // Hello), the server's answer (Ack and one byte framed) taken by the
    // reader, then the server's Switch and one byte on the ring.
    if (send(c, "q", 1, MSG_NOSIGNAL) != 1) return perror("send"), 2;
    s = accept(l, NULL, NULL);
    if (s < 0 || recv(s, &b, 1, MSG_WAITALL) != 1) return perror("server"), 2;
    pthread_create(&r, NULL, reader, NULL);
    if (send(s, "r", 1, MSG_NOSIGNAL) != 1 || !reader_got(1)) return perror("server send"), 2;
    // The client attached as the reader took the Ack; its next byte is its Switch.
    if (send(c, "q", 1, MSG_NOSIGNAL) != 1 || recv(s, &b, 1, MSG_WAITALL) != 1) return perror("client"), 2;
  } else {
    // The client's next byte switches its own direction: no edge the waiter sees.
    if (send(c, "q", 1, MSG_NOSIGNAL) != 1 || recv(s, &b, 1, MSG_WAITALL) != 1) return perror("client"), 2;
    pthread_create(&r, NULL, reader, NULL);
  }
  if (send(s, "r", 1, MSG_NOSIGNAL) != 1) return perror("server send"), 2;
  pthread_join(r, NULL);
  close(l);
  atomic_store(&g_hog_on, 0);
  pthread_join(h, NULL);
  if (atomic_load(&g_reader_got) < g_reader_wants) {
    return printf("round %d: the reader never got the server's bytes\n", i), 2;
  }
  // The race is run: the waiter gets a normal share of any CPU again (other
  // tests may run beside this one), and runs (woken by the Switch, it found
  // nothing; or by a kick, and it looked).
  struct sched_param normal = {0};
  sched_setscheduler(tid, SCHED_OTHER, &normal);
  cpu_set_t any;
  CPU_ZERO(&any);
  CPU_SET(0, &any);
  CPU_SET(1, &any);
  sched_setaffinity(tid, sizeof any, &any);
  usleep(20000);
  double sent = now_ms();
  if (send(s, "x", 1, MSG_NOSIGNAL) != 1) return perror("server send"), 2;
  pthread_join(w, NULL);
  double late = g_woke_ms - sent;
  int bad = g_n != 1 || !(g_events & (POLLIN | EPOLLIN)) || late > 500;
  if (bad) {
    printf("round %d: %s returned %d, events 0x%x, %.0f ms after the second byte (expected POLLIN at once)\n", i,
           g_poll_mode ? "poll" : "epoll_wait", g_n, g_events, late);
  }
  if (g_ep >= 0) close(g_ep);
  close(s);
  close(c);
  return bad;
}

int main(int argc, char** argv) {
  const char* how = argc > 1 ? argv[1] : "";
  g_poll_mode = !strncmp(how, "poll", 4);
  g_fresh = strstr(how, "fresh") != NULL;
  if (strcmp(how, "epoll") && strcmp(how, "poll") && strcmp(how, "epoll-fresh") && strcmp(how, "poll-fresh")) {
    fprintf(stderr, "usage: switch_while_asleep epoll|poll|epoll-fresh|poll-fresh [ROUNDS]\n");
    return 2;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0 || !CPU_ISSET(0, &set) || !CPU_ISSET(1, &set)) {
    printf("skipped: needs CPUs 0 and 1\n");
    return 77;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 10;
  int rc = 0;
  for (int i = 0; i < rounds && rc == 0; ++i) rc = round_once(i);
  printf("%s\n", rc == 0 ? "ok" : rc == 1 ? "FAIL: a sleeper missed the bytes after the switch" : "error");
  return rc;
}
