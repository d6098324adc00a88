// Edge-triggered epoll and a FIN that arrives while another thread is in a
// non-blocking read of the same socket, as asio's reactor and a speculative
// read meet (asio_test hung this way once in ~120 rounds of 128 connections:
// a client waiting for EOF after its half-close). Natively the FIN is an
// edge that epoll_wait reports at once (EPOLLIN | EPOLLRDHUP), whoever reads
// meanwhile. Under rdmashim the set's look at the TCP side found the receive
// lock held by that read (about to return EAGAIN) and left the FIN unread;
// the kernel's edge was spent, and the wait slept to its timeout.
//
// Each round: a connection with both directions past the upgrade (two
// exchanges), the client in an edge-triggered set, one thread making one
// non-blocking read of the client, the server's shutdown(SHUT_WR) as that
// read runs, and a wait that must report the end within 500 ms (its timeout
// is 2 s). Under RDMASHIM_TEST_SCHEDULE=<seed> the read sometimes pauses
// just before its EAGAIN (the read-empty point), which makes the race likely.
//
// usage: epoll_fin_race [ROUNDS (200)]; exits 0 when every round did.
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "loopback_pair.h"

static atomic_int g_reading;

static void* read_once(void* arg) {
  int fd = *(int*)arg;
  char b[16];
  atomic_store(&g_reading, 1);
  (void)recv(fd, b, sizeof b, MSG_DONTWAIT);  // EAGAIN, or the end if the FIN came first
  return NULL;
}

static int exchange(int from, int to) {
  char b = 'x';
  return send(from, &b, 1, MSG_NOSIGNAL) == 1 && recv(to, &b, 1, MSG_WAITALL) == 1 ? 0 : -1;
}

static double ms_since(const struct timespec* t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  int l, c, failed = 0;
  for (int i = 0; i < rounds && !failed; ++i) {
    if (loopback_pair(&l, &c) != 0) return perror("listen/connect"), 2;
    int s = accept(l, NULL, NULL);
    close(l);
    // Past the upgrade both ways: the client's byte, then the server's, twice.
    if (s < 0 || exchange(c, s) || exchange(s, c) || exchange(c, s) || exchange(s, c)) return perror("exchange"), 2;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u64 = 7}, got;
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    pthread_t reader;
    atomic_store(&g_reading, 0);
    pthread_create(&reader, NULL, read_once, &c);
    while (!atomic_load(&g_reading)) {
    }
    shutdown(s, SHUT_WR);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int n = epoll_wait(ep, &got, 1, 2000);
    double ms = ms_since(&t0);
    if (n != 1 || !(got.events & (EPOLLIN | EPOLLRDHUP)) || ms > 500) {
      printf("round %d: epoll_wait %d event(s), events 0x%x, after %.0f ms (expected EPOLLIN|EPOLLRDHUP at once)\n", i,
             n, n == 1 ? got.events : 0, ms);
      failed = 1;
    }
    pthread_join(reader, NULL);
    close(ep);
    close(s);
    close(c);
  }
  printf("%s\n", failed ? "FAIL: the peer's FIN was reported late or never" : "ok");
  return failed;
}
