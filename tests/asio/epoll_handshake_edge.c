// Edge-triggered epoll on an accepted socket, in the order a multi-threaded
// event loop (asio with several threads running the io_context) produces:
// the reactor looks at the set before the application's first read is
// queued, the read then finds nothing (EAGAIN), and the client's first bytes
// arrive afterwards. Natively epoll reports nothing at the first look and
// EPOLLIN when the bytes arrive. Each arrival of data is a new edge, so the
// second wait must report EPOLLIN whatever the first one said.
// Exits 0 when it did; bounded (1 s wait).
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

int main(void) {
  int l, c;
  if (loopback_pair(&l, &c) != 0) return perror("listen/connect"), 2;
  int s = accept(l, NULL, NULL);
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 7}, got;
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
  usleep(10000);

  int n1 = epoll_wait(ep, &got, 1, 0);  // the reactor looks first
  char buf[64];
  ssize_t r1 = recv(s, buf, sizeof buf, 0);  // the application's read: nothing yet
  int e1 = errno;
  printf("1. before the client wrote: epoll_wait %d event(s) (natively 0); recv %zd (%s)\n", n1, r1,
         r1 < 0 ? strerror(e1) : "data?!");
  if (r1 >= 0) return printf("FAIL: recv returned data nobody sent\n"), 1;

  send(c, "hello", 5, MSG_NOSIGNAL);  // the client's first bytes
  int n2 = epoll_wait(ep, &got, 1, 1000);
  printf("2. after the client sent 5 bytes: epoll_wait %d event(s), events 0x%x (expected 1, EPOLLIN)\n", n2,
         n2 == 1 ? got.events : 0);
  ssize_t r2 = recv(s, buf, sizeof buf, 0);
  printf("3. recv: %zd\n", r2);
  int ok = n2 == 1 && (got.events & EPOLLIN) && got.data.u64 == 7 && r2 == 5;
  printf("%s\n", ok ? "ok" : "FAIL: the bytes arrived but epoll_wait never reported them");
  return ok ? 0 : 1;
}
