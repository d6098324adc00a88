// Edge-triggered epoll across the move of a client's receive direction from
// TCP onto the ring, in the order asio's reactor can produce (asio.preload_
// native_connect hung this way once in 60 runs): the server's first reply
// goes over TCP (the client has not attached yet), later ones on the ring.
// Natively, every arrival of data after a wait is a new edge; each wait
// below must report EPOLLIN.
//
//   count: the client met EAGAIN 3 times on TCP, then 3 bytes arrive on the
//          ring. Under rdmashim the wait once compared the TCP side's count
//          of EAGAINs with the ring's tail, found both 3, and slept.
//   short: the client read its first reply with room to spare (no EAGAIN,
//          as asio after a short read), then the next reply arrives with the
//          server's Switch on TCP: no EAGAIN since, yet it is a new edge.
//
// Exits 0 when every wait reported; bounded (1 s per wait).
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loopback_pair.h"

static int wait_in(int ep, const char* what) {
  struct epoll_event got;
  int n = epoll_wait(ep, &got, 1, 1000);
  int ok = n == 1 && (got.events & EPOLLIN) && got.data.u64 == 7;
  printf("%s: epoll_wait %d event(s), events 0x%x (expected 1, EPOLLIN)\n", what, n, n == 1 ? got.events : 0);
  return ok;
}

static int recv_exact(int fd, char* buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t r = recv(fd, buf + got, len - got, 0);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

int main(int argc, char** argv) {
  int count_mode = argc > 1 && strcmp(argv[1], "count") == 0;
  if (argc != 2 || (!count_mode && strcmp(argv[1], "short") != 0)) {
    fprintf(stderr, "usage: epoll_switch_edge count|short\n");
    return 2;
  }
  int l, c;
  if (loopback_pair(&l, &c) != 0) return perror("listen/connect"), 2;
  fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 7};
  epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);

  char req[32], buf[64];
  memset(req, 'q', sizeof req);
  if (send(c, req, sizeof req, MSG_NOSIGNAL) != (ssize_t)sizeof req) return perror("send"), 2;
  int agains = count_mode ? 3 : 1;
  for (int i = 0; i < agains; ++i) {
    if (recv(c, buf, sizeof buf, 0) >= 0 || errno != EAGAIN) return printf("FAIL: a reply before the server ran\n"), 1;
  }

  int s = accept(l, NULL, NULL);
  if (s < 0 || recv_exact(s, buf, sizeof req) != 0) return perror("server recv"), 2;
  send(s, req, sizeof req, MSG_NOSIGNAL);  // the reply: over TCP, the client is not attached yet
  int ok = wait_in(ep, "1. the first reply");
  if (count_mode) {
    // Read exactly the reply: no EAGAIN (asio's read of a known length).
    if (recv_exact(c, buf, sizeof req) != 0) return printf("FAIL: the first reply\n"), 1;
    send(c, "a", 1, MSG_NOSIGNAL);  // the client now writes on the ring
    if (recv_exact(s, buf, 1) != 0) return perror("server recv"), 2;
    send(s, "b", 1, MSG_NOSIGNAL);  // the server's Switch, then its first byte on the ring
    if (recv_exact(c, buf, 1) != 0 || buf[0] != 'b') return printf("FAIL: the second reply\n"), 1;
    send(s, "cd", 2, MSG_NOSIGNAL);  // the ring's tail is now 3, as the count of EAGAINs
    ok &= wait_in(ep, "2. two more bytes on the ring");
    ok &= recv(c, buf, sizeof buf, 0) == 2;
  } else {
    // Read with room to spare: everything, but no EAGAIN (asio after a short read).
    ssize_t r = recv(c, buf, sizeof buf, 0);
    if (r != (ssize_t)sizeof req) return printf("FAIL: the first reply: %zd\n", r), 1;
    send(s, "b", 1, MSG_NOSIGNAL);  // the server's Switch (on TCP), then a byte on the ring
    ok &= wait_in(ep, "2. the next reply");
    ok &= recv(c, buf, sizeof buf, 0) == 1;
  }
  printf("%s\n", ok ? "ok" : "FAIL: bytes arrived but epoll_wait never reported them");
  return ok ? 0 : 1;
}
