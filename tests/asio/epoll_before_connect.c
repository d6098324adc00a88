// The pattern under asio's async_connect (and nginx's upstream connects): a
// socket is added to an epoll set BEFORE connect(), the non-blocking connect
// is waited for with EPOLL_CTL_MOD (+EPOLLOUT) and epoll_wait, and the
// connection is then driven by epoll alone. Every epoll call must behave as
// natively: the MOD succeeds, EPOLLOUT is reported with the application's
// data, every echo (on the ring, after the upgrade) is reported as EPOLLIN,
// and DEL succeeds. Exits 0 when all of that held; prints what did not.
// Each wait is bounded (2 s for the connect, 0.5 s per answer).
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static int failures;
#define EXPECT(cond, ...)                       \
  do {                                          \
    if (!(cond)) {                              \
      printf("FAIL: " __VA_ARGS__);             \
      printf("   [%s]\n", #cond);               \
      ++failures;                               \
    }                                           \
  } while (0)

int main(void) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, 4) != 0) return perror("listen"), 2;
  getsockname(l, (struct sockaddr*)&a, &len);

  int ep = epoll_create1(EPOLL_CLOEXEC);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 42};
  int r = epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
  EXPECT(r == 0, "EPOLL_CTL_ADD before connect: %s\n", strerror(errno));
  fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
  r = connect(c, (struct sockaddr*)&a, sizeof a);
  EXPECT(r == 0 || errno == EINPROGRESS, "connect: %s\n", strerror(errno));

  ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
  r = epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev);
  EXPECT(r == 0, "EPOLL_CTL_MOD (+EPOLLOUT) after connect returned %d: %s (natively 0)\n", r,
         r ? strerror(errno) : "");
  struct epoll_event got = {0};
  r = epoll_wait(ep, &got, 1, 2000);
  EXPECT(r == 1 && (got.events & EPOLLOUT) && got.data.u64 == 42,
         "epoll_wait for the connect: %d event(s), events 0x%x, data %llu (expected EPOLLOUT, data 42)\n", r,
         r == 1 ? got.events : 0, r == 1 ? (unsigned long long)got.data.u64 : 0ull);
  int err = -1;
  len = sizeof err;
  getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len);
  EXPECT(err == 0, "SO_ERROR after connect: %s\n", strerror(err));

  int s = accept(l, NULL, NULL);
  if (s < 0) return perror("accept"), 2;
  // The server answers each message; the client learns of each answer from epoll only.
  for (int i = 0; i < 8; ++i) {
    char out[16], in[16], buf[16];
    snprintf(out, sizeof out, "message %07d", i);
    ssize_t n = send(c, out, sizeof out, MSG_NOSIGNAL);
    EXPECT(n == (ssize_t)sizeof out, "send %d: %zd %s\n", i, n, strerror(errno));
    size_t have = 0;
    while (have < sizeof buf) {
      n = recv(s, buf + have, sizeof buf - have, 0);
      if (n <= 0) break;
      have += (size_t)n;
    }
    EXPECT(have == sizeof buf, "server recv %d: %zu bytes\n", i, have);
    // Nothing to read yet: the client drains to EAGAIN, as an edge-triggered loop does.
    n = recv(c, in, sizeof in, 0);
    EXPECT(n < 0 && errno == EAGAIN, "round %d: client recv before the answer: %zd\n", i, n);
    send(s, buf, have, MSG_NOSIGNAL);
    r = epoll_wait(ep, &got, 1, 500);
    EXPECT(r == 1 && got.data.u64 == 42 && (got.events & EPOLLIN),
           "round %d: epoll_wait reported %d event(s) (events 0x%x, data %llu) for the answer, expected EPOLLIN, "
           "data 42\n", i, r, r == 1 ? got.events : 0, r == 1 ? (unsigned long long)got.data.u64 : 0ull);
    have = 0;
    while (have < sizeof in) {
      n = recv(c, in + have, sizeof in - have, 0);
      if (n <= 0) break;
      have += (size_t)n;
    }
    EXPECT(have == sizeof in, "round %d: client recv: %zu bytes\n", i, have);
    if (have != sizeof in) break;
    EXPECT(memcmp(in, out, sizeof in) == 0, "round %d: echo differs\n", i);
  }
  r = epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL);
  EXPECT(r == 0, "EPOLL_CTL_DEL returned %d: %s (natively 0)\n", r, r ? strerror(errno) : "");
  close(c);
  close(s);
  close(l);
  close(ep);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
