// Descriptors: dup, dup2, dup3, F_DUPFD, F_DUPFD_CLOEXEC, close-on-exec
// flags, and close() from one thread while another blocks in recv().
#include <sys/eventfd.h>
#include <sys/syscall.h>

#include <thread>

#include "sc_common.h"

using namespace diff;

namespace {

// One message each way through the given descriptor numbers: the server
// writes `tag` via `out`, the client echoes it back, the server reads it via
// `in`. The client side is echo_peer().
void through(int out, int in, const char* tag) {
  size_t n = strlen(tag);
  auto r = E(write(out, tag, n));
  char buf[64] = {};
  read_exact(in, buf, n);
  T("write via one name = %s, echo read via another = %s", r.c_str(), quote(buf, n).c_str());
}

// Echoes whatever arrives (the server sends one short tag at a time and
// waits for it to come back) until EOF or an error.
void echo_peer(Pair& p) {
  char buf[256];
  int msgs = 0;
  for (;;) {
    ssize_t n = read(p.fd, buf, sizeof buf);
    if (n <= 0) {
      T("echoed %d messages, then read = %s", msgs, E(n).c_str());
      return;
    }
    write_all(p.fd, buf, static_cast<size_t>(n));
    msgs++;
  }
}

}  // namespace

SCENARIO(dup_basic, 2) {
  run_pair(
      [](Pair& p) {
        int d = dup(p.fd);
        T("dup ok: %s; cloexec: %s", yes(d >= 0).c_str(), yes(is_cloexec(d)).c_str());
        through(d, p.fd, "via-dup");
        through(p.fd, d, "via-orig");
        auto r = E(close(p.fd));
        T("close(original) = %s", r.c_str());
        through(d, d, "dup-only");
        int d2 = dup(d);
        close(d);
        through(d2, d2, "dup-of-dup");
        close(d2);
      },
      echo_peer);
}

SCENARIO(dup2_dup3, 2) {
  run_pair(
      [](Pair& p) {
        auto r = E(dup2(p.fd, 100));
        T("dup2(fd, 100) = %s; cloexec %s", r.c_str(), yes(is_cloexec(100)).c_str());
        r = E(dup3(p.fd, 101, O_CLOEXEC));
        T("dup3(fd, 101, O_CLOEXEC) = %s; cloexec %s", r.c_str(), yes(is_cloexec(101)).c_str());
        r = E(dup3(p.fd, p.fd, 0));
        T("dup3(fd, fd) = %s", r.c_str());
        T("dup2(fd, fd) returns fd: %s", yes(dup2(p.fd, p.fd) == p.fd).c_str());
        r = E(dup3(p.fd, 102, 0x4000));
        T("dup3 with a bad flag = %s", r.c_str());
        r = E(dup2(4000, 103));
        T("dup2 of a closed fd = %s", r.c_str());
        through(100, 101, "100-to-101");
        int pp[2];
        pipe(pp);
        r = E(dup2(p.fd, pp[0]));
        T("dup2 onto a pipe's descriptor = %s", yes(r == std::to_string(pp[0])).c_str());
        through(pp[0], p.fd, "over-pipe");
        close(pp[0]);
        close(pp[1]);
        close(p.fd);
        through(100, 100, "only-100");
        close(100);
        through(101, 101, "only-101");
        r = E(dup2(101, 100));
        T("dup2(101, 100) again = %s", r.c_str());
        close(101);
        through(100, 100, "back-at-100");
        close(100);
      },
      echo_peer);
}

SCENARIO(fcntl_dupfd, 2) {
  run_pair(
      [](Pair& p) {
        int a = fcntl(p.fd, F_DUPFD, 200);
        T("F_DUPFD(200) >= 200: %s; cloexec %s", yes(a >= 200).c_str(), yes(is_cloexec(a)).c_str());
        int b = fcntl(p.fd, F_DUPFD_CLOEXEC, 300);
        T("F_DUPFD_CLOEXEC(300) >= 300: %s; cloexec %s", yes(b >= 300).c_str(), yes(is_cloexec(b)).c_str());
        auto r = E(fcntl(p.fd, F_DUPFD, -1));
        T("F_DUPFD(-1) = %s", r.c_str());
        through(a, b, "a-to-b");
        close(p.fd);
        through(b, a, "b-to-a");
        close(a);
        through(b, b, "b-only");
        r = E(fcntl(b, F_SETFD, 0));
        T("F_SETFD 0 = %s; cloexec %s", r.c_str(), yes(is_cloexec(b)).c_str());
        close(b);
      },
      echo_peer);
}

SCENARIO(dup2_onto_socket, 4) {
  // Two connections; dup2 one onto the other: the second is closed (its peer
  // sees EOF) and its number now names the first connection.
  set_role("server");
  uint16_t port;
  int lfd = make_listener(&port);
  Ctl s, c;
  make_ctl(&s, &c);
  pid_t pid = spawn("client", [&] {
    close(lfd);
    int a = connect_to(port);
    warm_client(a);
    int b = connect_to(port);
    warm_client(b);
    c.sync();
    char buf[16];
    auto r = E(read(b, buf, sizeof buf));
    T("second connection after the server's dup2 over it: read = %s", r.c_str());
    read_exact(a, buf, 5);
    T("first connection got %s", quote(buf, 5).c_str());
    write_all(a, "reply", 5);
    c.sync();
  });
  int a = accept_one(lfd);
  warm_server(a);
  int b = accept_one(lfd);
  warm_server(b);
  auto r = E(dup2(a, b));
  T("dup2(first, second) returns second: %s", yes(r == std::to_string(b)).c_str());
  s.sync();
  write_all(b, "hello", 5);
  char buf[5];
  read_exact(a, buf, 5);
  T("wrote via the second number, read the reply via the first: %s", quote(buf, 5).c_str());
  s.sync();
  reap(pid, "client");
}

SCENARIO(cloexec_flags, 2) {
  PairOpts o;
  o.accept_flags = SOCK_CLOEXEC;
  o.socket_flags = SOCK_CLOEXEC;
  run_pair(
      [](Pair& p) {
        T("accept4(SOCK_CLOEXEC): cloexec %s; listener cloexec %s", yes(is_cloexec(p.fd)).c_str(),
          yes(is_cloexec(p.lfd)).c_str());
        int fl = fcntl(p.fd, F_GETFL);
        T("F_GETFL: O_RDWR %s, O_NONBLOCK %s", yes((fl & O_ACCMODE) == O_RDWR).c_str(),
          yes(fl & O_NONBLOCK).c_str());
        auto r = E(fcntl(p.fd, F_SETFD, 0));
        T("F_SETFD 0 = %s; cloexec %s", r.c_str(), yes(is_cloexec(p.fd)).c_str());
        r = E(fcntl(p.fd, F_SETFD, FD_CLOEXEC));
        T("F_SETFD FD_CLOEXEC = %s; cloexec %s", r.c_str(), yes(is_cloexec(p.fd)).c_str());
        int d = dup(p.fd);
        T("dup of it: cloexec %s", yes(is_cloexec(d)).c_str());
        close(d);
        through(p.fd, p.fd, "cloexec-io");
        close(p.fd);
      },
      [](Pair& p) {
        T("socket(SOCK_CLOEXEC): cloexec %s", yes(is_cloexec(p.fd)).c_str());
        echo_peer(p);
      },
      o);
}

namespace {

// close() of a descriptor while another thread of the process blocks in
// recv() on it. Only robust facts: the blocked call returns within a bound
// once the peer acts, and the process survives.
void close_while_recv(bool peer_sends) {
  run_pair(
      [](Pair& p) {
        std::atomic<bool> done{false};
        std::thread t([&] {
          char buf[16];
          recv(p.fd, buf, sizeof buf, 0);
          done = true;
        });
        sleep_ms(100);  // let it block
        auto r = E(close(p.fd));
        T("close while another thread blocks in recv = %s", r.c_str());
        p.ctl.sync();  // the peer acts now
        uint64_t end = now_ms() + kBoundMs;
        while (!done && now_ms() < end) sleep_ms(5);
        T("the blocked recv returned within %d ms: %s", kBoundMs, yes(done).c_str());
        if (done) {
          t.join();
        } else {
          t.detach();
        }
        T("process alive");
        p.ctl.sync();  // (a thread stuck in recv ends with the process)
      },
      [peer_sends](Pair& p) {
        p.ctl.sync();
        if (peer_sends) {
          write_all(p.fd, "wake!", 5);
        } else {
          shutdown(p.fd, SHUT_WR);
        }
        p.ctl.sync();
      });
}

}  // namespace

SCENARIO(close_while_recv_peer_sends, 2) { close_while_recv(true); }
SCENARIO(close_while_recv_peer_shutdown, 2) { close_while_recv(false); }

// Daemons and spawn helpers close every descriptor from some number up with
// close_range() (or closefrom()): the number of a connection closed that
// way must not keep pointing at the connection once it is reused.
SCENARIO(close_range_reuse, 4) {
  run_pair(
      [](Pair& p) {
        int n = p.fd;
        T("close_range(fd, ~0U, 0) = %s", E(close_range(static_cast<unsigned>(n), ~0U, 0)).c_str());
        T("fcntl(F_GETFD) on the closed number = %s", E(fcntl(n, F_GETFD)).c_str());
        int e = eventfd(0, 0);
        int m = e == n ? n : fcntl(e, F_DUPFD, n);  // an eventfd gets the connection's old number
        T("an eventfd now has the old number: %s", yes(m == n).c_str());
        uint64_t v = 5;
        T("write(8) via the old number = %s", E(write(n, &v, 8)).c_str());
        pollfd pf{n, POLLIN | POLLOUT, 0};
        int pr = poll(&pf, 1, 0);
        T("poll on it = %s", pres(pr, pf).c_str());
        v = 0;
        ssize_t k = read(n, &v, 8);
        T("read(8) via the old number = %s, value %llu", E(k).c_str(), static_cast<unsigned long long>(v));
        close(m);
        if (e != m) close(e);
        p.ctl.sync();  // the client saw EOF and connects again
        int fd = accept_one(p.lfd);
        warm_server(fd);
        uint64_t got = recv_stream(fd, 43, 100000);
        T("a new connection afterwards: 100000 bytes ok: %s", yes(got == pattern_sum(43, 100000)).c_str());
        close(fd);
      },
      [](Pair& p) {
        char c;
        T("after the server's close_range: read = %s", E(read(p.fd, &c, 1)).c_str());
        close(p.fd);
        p.ctl.sync();
        int fd = connect_to(p.port);
        warm_client(fd);
        send_stream(fd, 43, 100000);
        T("second connection: sent");
        T("then read = %s", E(read(fd, &c, 1)).c_str());
      });
}
