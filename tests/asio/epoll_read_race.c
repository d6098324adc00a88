// Edge-triggered epoll and bytes that arrive while another thread is in a
// non-blocking read of the same socket, as asio's reactor and a speculative
// read meet (asio_test hung this way once in ~120 rounds of 128 connections:
// a client waiting for EOF after its half-close). Natively each arrival is
// an edge that epoll_wait reports at once, whoever reads meanwhile. Under
// rdmashim the set's look at the TCP side found the receive lock held by
// that read (about to return EAGAIN) and left what came unread; the
// kernel's edge was spent, and the wait slept to its timeout.
//
//   fin:    both directions on the ring; the server's shutdown(SHUT_WR).
//   switch: the client's receive direction still framed on TCP (its first
//           reply came before it attached); the server's next reply, its
//           Switch and two bytes on the ring, of which the read may take
//           one (it may take the Switch in: then the kernel's edge for it
//           is spent, and the ring's bytes may come before the set armed).
//   poll:   the same waited for with poll (level-triggered, no set).
//
// Each round: a new connection set up as the mode says, the client in an
// edge-triggered set, one thread making one non-blocking read of the
// client, the server's act as that read runs, and a wait that must report
// EPOLLIN within 500 ms (its timeout is 2 s). Under RDMASHIM_TEST_SCHEDULE
// the read sometimes pauses just before its EAGAIN (the read-empty point),
// which makes the race likely.
//
// usage: epoll_read_race fin|switch|poll [ROUNDS (200)]; exits 0 when every round did.
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "loopback_pair.h"

static atomic_int g_reading;

static void* read_once(void* arg) {
  int fd = *(int*)arg;
  char b[1];  // one byte: what came stays readable (a FIN anyway, and the second byte of a reply)
  atomic_store(&g_reading, 1);
  (void)recv(fd, b, sizeof b, MSG_DONTWAIT);  // EAGAIN, or what came first
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
  int fin_mode = argc > 1 && strcmp(argv[1], "fin") == 0;
  int poll_mode = argc > 1 && strcmp(argv[1], "poll") == 0;
  if (argc < 2 || (!fin_mode && !poll_mode && strcmp(argv[1], "switch") != 0)) {
    fprintf(stderr, "usage: epoll_read_race fin|switch|poll [ROUNDS]\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 200;
  int l, c, failed = 0;
  for (int i = 0; i < rounds && !failed; ++i) {
    if (loopback_pair(&l, &c) != 0) return perror("listen/connect"), 2;
    int s = -1, ep = -1;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u64 = 7}, got;
    if (fin_mode) {
      s = accept(l, NULL, NULL);
      // Past the upgrade both ways: the client's byte, then the server's, twice.
      if (s < 0 || exchange(c, s) || exchange(s, c) || exchange(c, s) || exchange(s, c)) return perror("exchange"), 2;
    } else {
      // The client writes first and the server answers before the client
      // attached (its Ack and reply framed on TCP); then the client's next
      // byte goes on the ring, and its receive side is still framed.
      char b;
      if (send(c, "q", 1, MSG_NOSIGNAL) != 1) return perror("send"), 2;
      s = accept(l, NULL, NULL);
      if (s < 0 || recv(s, &b, 1, MSG_WAITALL) != 1 || send(s, "r", 1, MSG_NOSIGNAL) != 1) return perror("server"), 2;
      // The reply is reported by the set (which remembers it saw the client
      // readable) and read exactly: no EAGAIN since, as asio after a read of
      // a known length.
      struct pollfd p = {.fd = c, .events = POLLIN};
      if (!poll_mode) {
        ep = epoll_create1(EPOLL_CLOEXEC);
        epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
      }
      if ((poll_mode ? poll(&p, 1, 1000) : epoll_wait(ep, &got, 1, 1000)) != 1) {
        return printf("FAIL: the first reply was not reported\n"), 1;
      }
      if (recv(c, &b, 1, MSG_WAITALL) != 1 || send(c, "q", 1, MSG_NOSIGNAL) != 1) return perror("client"), 2;
      if (recv(s, &b, 1, MSG_WAITALL) != 1) return perror("server"), 2;
    }
    close(l);
    if (ep < 0 && !poll_mode) {
      ep = epoll_create1(EPOLL_CLOEXEC);
      epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    }
    pthread_t reader;
    atomic_store(&g_reading, 0);
    pthread_create(&reader, NULL, read_once, &c);
    while (!atomic_load(&g_reading)) {
    }
    if (fin_mode) {
      shutdown(s, SHUT_WR);
    } else {
      send(s, "rr", 2, MSG_NOSIGNAL);  // the server's Switch, then two bytes on the ring
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct pollfd p = {.fd = c, .events = POLLIN};
    int n = poll_mode ? poll(&p, 1, 2000) : epoll_wait(ep, &got, 1, 2000);
    if (poll_mode) got.events = (uint32_t)p.revents;
    double ms = ms_since(&t0);
    if (n != 1 || !(got.events & EPOLLIN) || ms > 500) {
      printf("round %d: %s %d event(s), events 0x%x, after %.0f ms (expected EPOLLIN at once)\n", i, poll_mode ? "poll" : "epoll_wait",
             n, n == 1 ? got.events : 0, ms);
      failed = 1;
    }
    pthread_join(reader, NULL);
    if (ep >= 0) close(ep);
    close(s);
    close(c);
  }
  printf("%s\n", failed ? "FAIL: the bytes were reported late or never" : "ok");
  return failed;
}
