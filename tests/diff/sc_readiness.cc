// Readiness: poll, ppoll, select, pselect and the epoll family, on upgraded
// sockets alone and mixed with kernel descriptors; signal masks; event loops.
//
// Rule for determinism: "ready" is checked with a long timeout (returns as
// soon as it is true, so the answer does not depend on when the bytes land);
// "not ready" is checked with timeout 0 or a short one only in states where
// nothing can change (the peer is parked at a barrier).
#include <sys/eventfd.h>
#include <sys/syscall.h>

#include <cstdio>
#include <thread>

#include "sc_common.h"

using namespace diff;

namespace {

constexpr uint64_t kSock = 0xFEEDFACECAFEBEEFull;  // distinctive user data
constexpr uint64_t kPipe = 0x0123456789ABCDEFull;
constexpr uint64_t kPipe2 = 0xFFFFFFFFFFFFFFFFull;
constexpr uint64_t kZero = 0;

std::string waited(uint64_t t0, uint64_t ms) {
  return "waited >= " + std::to_string(ms) + " ms: " + yes(now_ms() - t0 >= ms);
}

// The client half most readiness scenarios use: at each step, after a
// barrier, write what the server asks for (a length; 0 = shut down writing,
// UINT64_MAX = stop).
void scripted_client(Pair& p) {
  for (;;) {
    uint64_t n = p.ctl.get();
    if (n == UINT64_MAX) break;
    if (n == 0) {
      shutdown(p.fd, SHUT_WR);
    } else {
      std::vector<char> b(n);
      fill_pattern(n, 0, b.data(), n);
      write_all(p.fd, b.data(), n);
    }
    p.ctl.sync();
  }
}
// Server side: ask the client for n bytes (0: SHUT_WR) and wait until done.
void ask(Pair& p, uint64_t n) {
  p.ctl.put(n);
  p.ctl.sync();
}
void stop(Pair& p) { p.ctl.put(UINT64_MAX); }

// " 0x.. 0x.." in ascending order: which registrations a run of waits saw.
std::string sorted_hex(std::vector<uint64_t> seen) {
  std::sort(seen.begin(), seen.end());
  std::string s;
  for (auto v : seen) {
    char buf[32];
    snprintf(buf, sizeof buf, " 0x%llx", static_cast<unsigned long long>(v));
    s += buf;
  }
  return s;
}

void drain(int fd, size_t n) {
  std::vector<char> b(n);
  read_exact(fd, b.data(), n);
}

}  // namespace

// ---------------------------------------------------------------------------
// poll / ppoll / select / pselect

SCENARIO(poll_basic, 2) {
  run_pair(
      [](Pair& p) {
        pollfd pf{p.fd, POLLIN | POLLOUT, 0};
        int k = poll(&pf, 1, 0);
        T("poll(IN|OUT, 0) idle = %s", pres(k, pf).c_str());
        pf = {p.fd, POLLIN, 0};
        k = poll(&pf, 1, 0);
        T("poll(IN, 0) idle = %s", pres(k, pf).c_str());
        uint64_t t0 = now_ms();
        k = poll(&pf, 1, 100);
        T("poll(IN, 100) idle = %s; %s", pres(k, pf).c_str(), waited(t0, 90).c_str());
        ask(p, 10);
        pf = {p.fd, POLLIN, 0};
        k = poll(&pf, 1, kBoundMs);
        T("after the peer wrote 10: poll(IN, 5000) = %s", pres(k, pf).c_str());
        pf = {p.fd, POLLIN | POLLOUT, 0};
        k = poll(&pf, 1, 0);
        T("poll(IN|OUT, 0) = %s", pres(k, pf).c_str());
        pf = {p.fd, POLLRDNORM | POLLWRNORM, 0};
        k = poll(&pf, 1, 0);
        T("poll(RDNORM|WRNORM, 0) = %s", pres(k, pf).c_str());
        pf = {p.fd, 0, 0};
        k = poll(&pf, 1, 0);
        T("poll(events 0, 0) = %s", pres(k, pf).c_str());
        drain(p.fd, 5);
        pf = {p.fd, POLLIN, 0};
        k = poll(&pf, 1, 0);
        T("after reading 5 of 10: poll(IN, 0) = %s", pres(k, pf).c_str());
        drain(p.fd, 5);
        k = poll(&pf, 1, 0);
        T("after reading all: poll(IN, 0) = %s", pres(k, pf).c_str());
        pollfd three[3] = {{p.fd, POLLIN | POLLOUT, 0}, {-1, POLLIN, 0}, {4000, POLLIN, 0}};
        k = poll(three, 3, 0);
        T("poll([sock, -1, closed fd 4000]) = %s: %s, %s, %s", E(k).c_str(), pollev(three[0].revents).c_str(),
          pollev(three[1].revents).c_str(), pollev(three[2].revents).c_str());
        ask(p, 0);
        T("after the peer's SHUT_WR: %s",
          pollev(poll_until(p.fd, POLLIN | POLLOUT | POLLRDHUP, POLLRDHUP)).c_str());
        char c;
        auto r = E(read(p.fd, &c, 1));
        T("read = %s", r.c_str());
        stop(p);
      },
      scripted_client);
}

SCENARIO(ppoll_basic, 2) {
  run_pair(
      [](Pair& p) {
        pollfd pf{p.fd, POLLIN | POLLOUT, 0};
        timespec zero{0, 0}, tenth{0, 100000000}, big{5, 0};
        int k = ppoll(&pf, 1, &zero, nullptr);
        T("ppoll(IN|OUT, 0) idle = %s", pres(k, pf).c_str());
        pf = {p.fd, POLLIN, 0};
        uint64_t t0 = now_ms();
        k = ppoll(&pf, 1, &tenth, nullptr);
        T("ppoll(IN, 100 ms) idle = %s; %s", pres(k, pf).c_str(), waited(t0, 90).c_str());
        ask(p, 10);
        k = ppoll(&pf, 1, &big, nullptr);
        T("after the peer wrote 10: ppoll(IN, 5 s) = %s", pres(k, pf).c_str());
        k = ppoll(&pf, 1, nullptr, nullptr);
        T("ppoll(IN, no timeout) = %s", pres(k, pf).c_str());
        drain(p.fd, 10);
        k = ppoll(&pf, 1, &zero, nullptr);
        T("after reading all: ppoll(IN, 0) = %s", pres(k, pf).c_str());
        timespec bad{0, 1000000000};
        k = ppoll(&pf, 1, &bad, nullptr);
        T("ppoll with tv_nsec = 1e9 = %s", E(k).c_str());
        stop(p);
      },
      scripted_client);
}

namespace {

std::string fdsets(int fd, fd_set& r, fd_set& w, fd_set& e) {
  return std::string("r=") + yes(FD_ISSET(fd, &r)) + " w=" + yes(FD_ISSET(fd, &w)) + " e=" + yes(FD_ISSET(fd, &e));
}

// select or pselect, with all three sets for fd as asked; prints the result.
void sel(bool use_pselect, int fd, bool r, bool w, bool e, long ms, const char* what) {
  fd_set rs, ws, es;
  FD_ZERO(&rs);
  FD_ZERO(&ws);
  FD_ZERO(&es);
  if (r) FD_SET(fd, &rs);
  if (w) FD_SET(fd, &ws);
  if (e) FD_SET(fd, &es);
  int k;
  uint64_t t0 = now_ms();
  if (use_pselect) {
    timespec ts{ms / 1000, (ms % 1000) * 1000000};
    k = pselect(fd + 1, &rs, &ws, &es, ms < 0 ? nullptr : &ts, nullptr);
  } else {
    timeval tv{ms / 1000, (ms % 1000) * 1000};
    k = select(fd + 1, &rs, &ws, &es, ms < 0 ? nullptr : &tv);
  }
  std::string res = E(k);
  T("%s = %s %s%s", what, res.c_str(), fdsets(fd, rs, ws, es).c_str(),
    ms >= 90 && k == 0 ? ("; " + waited(t0, 90)).c_str() : "");
}

void select_scenario(bool ps) {
  run_pair(
      [ps](Pair& p) {
        sel(ps, p.fd, true, true, true, 0, "select(r,w,e, 0) idle");
        sel(ps, p.fd, true, false, false, 100, "select(r, 100 ms) idle");
        ask(p, 10);
        sel(ps, p.fd, true, false, false, kBoundMs, "after the peer wrote 10: select(r, 5 s)");
        sel(ps, p.fd, true, true, true, 0, "select(r,w,e, 0)");
        sel(ps, p.fd, true, false, false, -1, "select(r, no timeout)");
        drain(p.fd, 10);
        sel(ps, p.fd, true, false, true, 0, "after reading all: select(r,e, 0)");
        ask(p, 0);
        poll_until(p.fd, POLLIN, POLLIN);
        sel(ps, p.fd, true, false, false, kBoundMs, "after the peer's SHUT_WR: select(r, 5 s)");
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(p.fd, &rs);
        timeval tv{0, 0};
        int k = select(-1, &rs, nullptr, nullptr, &tv);
        T("select(nfds -1) = %s", E(k).c_str());
        stop(p);
      },
      scripted_client);
}

}  // namespace

SCENARIO(select_basic, 2) { select_scenario(false); }
SCENARIO(pselect_basic, 2) { select_scenario(true); }

SCENARIO(poll_mixed_pipe, 2) {
  run_pair(
      [](Pair& p) {
        int a[2], b[2];
        pipe(a);
        pipe(b);
        pollfd f[3] = {{a[0], POLLIN, 0}, {p.fd, POLLIN, 0}, {b[0], POLLIN, 0}};
        auto show = [&](int k, const char* what) {
          T("%s = %s: pipe %s, sock %s, pipe2 %s", what, E(k).c_str(), pollev(f[0].revents).c_str(),
            pollev(f[1].revents).c_str(), pollev(f[2].revents).c_str());
        };
        int k = poll(f, 3, 0);
        show(k, "idle poll(0)");
        write(a[1], "p", 1);
        k = poll(f, 3, kBoundMs);
        show(k, "pipe written: poll(5000)");
        ask(p, 10);
        poll_until(p.fd, POLLIN, POLLIN);
        k = poll(f, 3, 0);
        show(k, "pipe and socket: poll(0)");
        char c;
        read(a[0], &c, 1);
        k = poll(f, 3, kBoundMs);
        show(k, "pipe read: poll(5000)");
        drain(p.fd, 10);
        k = poll(f, 3, 100);
        show(k, "all read: poll(100)");
        // A kernel descriptor becomes ready while we sleep with the socket in the set.
        std::thread t([&] {
          sleep_ms(50);
          write(b[1], "q", 1);
        });
        k = poll(f, 3, kBoundMs);
        t.join();
        show(k, "pipe2 written during the wait: poll(5000)");
        read(b[0], &c, 1);
        // The socket becomes ready while we sleep with pipes in the set.
        p.ctl.put(7);  // the client writes 7 bytes after a pause
        k = poll(f, 3, kBoundMs);
        show(k, "socket written during the wait: poll(5000)");
        p.ctl.sync();
        drain(p.fd, 7);
        stop(p);
      },
      [](Pair& p) {
        uint64_t n = p.ctl.get();
        write_all(p.fd, std::string(n, 'x').data(), n);
        p.ctl.sync();
        n = p.ctl.get();
        sleep_ms(50);
        write_all(p.fd, std::string(n, 'y').data(), n);
        p.ctl.sync();
        p.ctl.get();
      });
}

SCENARIO(select_mixed_pipe, 2) {
  run_pair(
      [](Pair& p) {
        int a[2];
        pipe(a);
        auto sel3 = [&](long ms, const char* what) {
          fd_set rs, ws;
          FD_ZERO(&rs);
          FD_ZERO(&ws);
          FD_SET(a[0], &rs);
          FD_SET(p.fd, &rs);
          FD_SET(a[1], &ws);
          int nfds = std::max(std::max(a[0], a[1]), p.fd) + 1;
          timeval tv{ms / 1000, (ms % 1000) * 1000};
          int k = select(nfds, &rs, &ws, nullptr, &tv);
          std::string res = E(k);
          T("%s = %s: pipe r=%s, sock r=%s, pipe-w w=%s", what, res.c_str(), yes(FD_ISSET(a[0], &rs)).c_str(),
            yes(FD_ISSET(p.fd, &rs)).c_str(), yes(FD_ISSET(a[1], &ws)).c_str());
        };
        sel3(0, "idle");
        write(a[1], "p", 1);
        sel3(0, "pipe written");
        ask(p, 10);
        poll_until(p.fd, POLLIN, POLLIN);
        sel3(0, "pipe and socket");
        char c;
        read(a[0], &c, 1);
        sel3(kBoundMs, "pipe read");
        drain(p.fd, 10);
        sel3(0, "all read");
        stop(p);
      },
      scripted_client);
}

SCENARIO(poll_peer_close, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client closed its socket
        short ev = poll_until(p.fd, POLLIN | POLLOUT | POLLRDHUP, POLLRDHUP);
        T("after the peer closed: %s", pollev(ev).c_str());
        char c;
        auto r = E(read(p.fd, &c, 1));
        T("read = %s", r.c_str());
        r = E(send(p.fd, "x", 1, MSG_NOSIGNAL));
        T("send 1 byte = %s", r.c_str());
        ev = poll_until(p.fd, POLLIN | POLLOUT, POLLHUP);
        T("then, eventually: %s", pollev(ev).c_str());
        int err = -1;
        socklen_t len = sizeof err;
        getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        T("SO_ERROR %s", err ? ename(err) : "0");
        pollfd pf{p.fd, POLLIN | POLLOUT, 0};
        int k = poll(&pf, 1, 0);
        T("poll after SO_ERROR = %s", pres(k, pf).c_str());
      },
      [](Pair& p) {
        close(p.fd);
        p.ctl.sync();
      });
}

SCENARIO(readiness_listener, 2) {
  set_role("server");
  uint16_t port;
  int lfd = make_listener(&port, SOCK_NONBLOCK);
  Ctl s, c;
  make_ctl(&s, &c);
  pid_t pid = spawn("client", [&] {
    close(lfd);
    c.sync();
    int fd = connect_to(port);
    c.sync();
    warm_client(fd);
    T("exchange ok");
  });
  pollfd pf{lfd, POLLIN, 0};
  int k = poll(&pf, 1, 0);
  T("listener idle: poll = %s", pres(k, pf).c_str());
  auto r = E(accept(lfd, nullptr, nullptr));
  T("accept on idle non-blocking listener = %s", r.c_str());
  int ep = epoll_create1(0);
  epoll_add(ep, lfd, EPOLLIN, kSock);
  s.sync();
  s.sync();  // the client connected
  k = poll(&pf, 1, kBoundMs);
  T("after a connect: poll = %s", pres(k, pf).c_str());
  epoll_event ev[4];
  k = epoll_wait(ep, ev, 4, kBoundMs);
  T("epoll_wait = %s", evs(k, ev).c_str());
  int fd = accept(lfd, nullptr, nullptr);
  T("accept ok: %s", yes(fd >= 0).c_str());
  r = E(accept(lfd, nullptr, nullptr));
  T("accept again = %s", r.c_str());
  k = epoll_wait(ep, ev, 4, 0);
  T("epoll_wait(0) = %s", evs(k, ev).c_str());
  warm_server(fd);
  reap(pid, "client");
}

// ---------------------------------------------------------------------------
// epoll

SCENARIO(epoll_lt_basic, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_event ev[8];
        auto r = E(epoll_add(ep, p.fd, EPOLLIN, kSock));
        T("ADD EPOLLIN = %s", r.c_str());
        int k = epoll_wait(ep, ev, 8, 0);
        T("idle wait(0) = %s", evs(k, ev).c_str());
        uint64_t t0 = now_ms();
        k = epoll_wait(ep, ev, 8, 100);
        T("idle wait(100) = %s; %s", evs(k, ev).c_str(), waited(t0, 90).c_str());
        ask(p, 10);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer wrote 10: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("again, level-triggered: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 5);
        k = epoll_wait(ep, ev, 8, 0);
        T("after reading 5: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 5);
        k = epoll_wait(ep, ev, 8, 0);
        T("after reading all: wait(0) = %s", evs(k, ev).c_str());
        r = E(epoll_mod(ep, p.fd, EPOLLIN | EPOLLOUT, kZero));
        T("MOD EPOLLIN|EPOLLOUT, data 0 = %s", r.c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("wait(0) = %s", evs(k, ev).c_str());
        r = E(epoll_mod(ep, p.fd, EPOLLIN | EPOLLOUT | EPOLLRDNORM | EPOLLWRNORM, kPipe2));
        k = epoll_wait(ep, ev, 8, 0);
        T("MOD with RDNORM|WRNORM = %s; wait(0) = %s", r.c_str(), evs(k, ev).c_str());
        r = E(epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr));
        k = epoll_wait(ep, ev, 8, 0);
        T("DEL = %s; wait(0) = %s", r.c_str(), evs(k, ev).c_str());
        r = E(epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr));
        T("DEL again = %s", r.c_str());
        r = E(epoll_mod(ep, p.fd, EPOLLIN, kSock));
        T("MOD unregistered = %s", r.c_str());
        r = E(epoll_add(ep, p.fd, EPOLLIN, kSock));
        T("ADD = %s", r.c_str());
        r = E(epoll_add(ep, p.fd, EPOLLIN, kSock));
        T("ADD twice = %s", r.c_str());
        ask(p, 3);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("re-added, after the peer wrote 3: wait(5000) = %s", evs(k, ev).c_str());
        drain(p.fd, 3);
        stop(p);
      },
      scripted_client);
}

SCENARIO(epoll_ctl_errors, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_event e{};
        e.events = EPOLLIN;
        auto r = E(epoll_ctl(p.fd, EPOLL_CTL_ADD, p.fd, &e));
        T("epoll_ctl with the socket as epfd = %s", r.c_str());
        r = E(epoll_ctl(ep, EPOLL_CTL_ADD, ep, &e));
        T("ADD the set to itself = %s", r.c_str());
        r = E(epoll_ctl(ep, EPOLL_CTL_ADD, 4000, &e));
        T("ADD a closed fd = %s", r.c_str());
        r = E(epoll_ctl(4000, EPOLL_CTL_ADD, p.fd, &e));
        T("epfd closed = %s", r.c_str());
        r = E(epoll_ctl(ep, 99, p.fd, &e));
        T("op 99 = %s", r.c_str());
        int file = open("/proc/self/exe", O_RDONLY);
        r = E(epoll_ctl(ep, EPOLL_CTL_ADD, file, &e));
        T("ADD a regular file = %s", r.c_str());
        epoll_event ev[2];
        r = E(epoll_wait(ep, ev, 0, 0));
        T("wait maxevents 0 = %s", r.c_str());
        volatile int negative = -1;  // not a constant: keeps the compiler's overflow warning quiet
        r = E(epoll_wait(ep, ev, negative, 0));
        T("wait maxevents -1 = %s", r.c_str());
        r = E(epoll_wait(p.fd, ev, 2, 0));
        T("wait on the socket (not an epoll fd) = %s", r.c_str());
        r = E(epoll_wait(4000, ev, 2, 0));
        T("wait on a closed fd = %s", r.c_str());
        r = E(epoll_add(ep, p.fd, EPOLLIN, kSock));
        T("ADD the socket = %s", r.c_str());
        r = E(epoll_ctl(ep, EPOLL_CTL_ADD, p.fd, nullptr));
        T("ADD again with a null event = %s", r.c_str());
        stop(p);
      },
      scripted_client);
}

SCENARIO(epoll_create_variants, 2) {
  run_pair(
      [](Pair& p) {
        auto r = E(epoll_create(0));
        T("epoll_create(0) = %s", r.c_str());
        r = E(epoll_create(-1));
        T("epoll_create(-1) = %s", r.c_str());
        r = E(epoll_create1(0x1));
        T("epoll_create1(0x1) = %s", r.c_str());
        int a = epoll_create(1), b = epoll_create1(0), c = epoll_create1(EPOLL_CLOEXEC);
        T("epoll_create(1) ok: %s, cloexec %s", yes(a >= 0).c_str(), yes(is_cloexec(a)).c_str());
        T("epoll_create1(0) ok: %s, cloexec %s", yes(b >= 0).c_str(), yes(is_cloexec(b)).c_str());
        T("epoll_create1(EPOLL_CLOEXEC) ok: %s, cloexec %s", yes(c >= 0).c_str(), yes(is_cloexec(c)).c_str());
        epoll_add(a, p.fd, EPOLLIN, 1);
        epoll_add(b, p.fd, EPOLLIN, 2);
        epoll_add(c, p.fd, EPOLLIN, 3);
        ask(p, 4);
        epoll_event ev[4];
        for (int ep : {a, b, c}) {
          int k = epoll_wait(ep, ev, 4, kBoundMs);
          T("wait = %s", evs(k, ev).c_str());
        }
        drain(p.fd, 4);
        stop(p);
      },
      scripted_client);
}

SCENARIO(epoll_et_in, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN | EPOLLET, kSock);
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, 0);
        T("idle wait(0) = %s", evs(k, ev).c_str());
        ask(p, 10);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer wrote 10: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("again, nothing new (bytes unread): wait(0) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 100);
        T("wait(100) = %s", evs(k, ev).c_str());
        ask(p, 20);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after 20 more: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("again: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 30);
        char c;
        auto r = E(recv(p.fd, &c, 1, MSG_DONTWAIT));
        T("read all 30; recv(MSG_DONTWAIT) = %s", r.c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("wait(0) = %s", evs(k, ev).c_str());
        ask(p, 5);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after 5 more: wait(5000) = %s", evs(k, ev).c_str());
        drain(p.fd, 5);
        ask(p, 0);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer's SHUT_WR: wait(5000) = %s", evs(k, ev).c_str());
        stop(p);
      },
      scripted_client);
}

SCENARIO(epoll_et_out, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        set_nonblock(p.fd, true);
        epoll_add(ep, p.fd, EPOLLOUT | EPOLLET, kSock);
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, kBoundMs);
        T("fresh: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("again: wait(0) = %s", evs(k, ev).c_str());
        std::vector<char> buf(16384, 'o');
        uint64_t total = 0;
        int err = 0;
        while (total < (512ull << 20)) {
          ssize_t n = write(p.fd, buf.data(), buf.size());
          if (n < 0) {
            err = errno;
            break;
          }
          total += static_cast<uint64_t>(n);
        }
        T("filled until %s", err ? ename(err) : "the cap");
        p.ctl.put(total);
        p.ctl.sync();  // the client read everything
        T("after the peer drained: %s", epollev(epoll_until(ep, kSock, EPOLLOUT)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        uint64_t n = p.ctl.get();
        std::vector<char> b(65536);
        for (uint64_t got = 0; got < n;) {
          size_t k = static_cast<size_t>(std::min<uint64_t>(b.size(), n - got));
          read_exact(p.fd, b.data(), k);
          got += k;
        }
        p.ctl.sync();
        p.ctl.sync();
      });
}

SCENARIO(epoll_oneshot, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN | EPOLLONESHOT, kSock);
        epoll_event ev[8];
        ask(p, 10);
        int k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer wrote 10: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("disarmed: wait(0) = %s", evs(k, ev).c_str());
        ask(p, 10);
        k = epoll_wait(ep, ev, 8, 100);
        T("disarmed, 10 more arrived: wait(100) = %s", evs(k, ev).c_str());
        auto r = E(epoll_mod(ep, p.fd, EPOLLIN | EPOLLONESHOT, kPipe));
        k = epoll_wait(ep, ev, 8, 0);
        T("MOD re-arm (new data) = %s; wait(0) = %s", r.c_str(), evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("disarmed again: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 20);
        epoll_mod(ep, p.fd, EPOLLIN | EPOLLONESHOT, kPipe2);
        k = epoll_wait(ep, ev, 8, 0);
        T("read all, re-armed: wait(0) = %s", evs(k, ev).c_str());
        ask(p, 1);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after 1 more: wait(5000) = %s", evs(k, ev).c_str());
        drain(p.fd, 1);
        r = E(epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr));
        T("DEL a disarmed one = %s", r.c_str());
        stop(p);
      },
      scripted_client);
}

// Event loops delete and add a socket per request (redis-benchmark: DEL,
// ADD OUT, DEL, ADD IN, MOD IN). Each step's answer, and what a wait
// reports between them, as on the kernel.
SCENARIO(epoll_del_add_churn, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_event ev[8];
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        ask(p, 10);
        int k = epoll_wait(ep, ev, 8, kBoundMs);
        T("10 arrived: wait = %s", evs(k, ev).c_str());
        for (int round = 0; round < 3; ++round) {
          auto r = E(epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr));
          auto again = E(epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr));
          auto mod = E(epoll_mod(ep, p.fd, EPOLLIN, kPipe));
          k = epoll_wait(ep, ev, 8, 0);
          T("round %d: DEL = %s, DEL again = %s, MOD = %s; wait(0) = %s", round, r.c_str(), again.c_str(),
            mod.c_str(), evs(k, ev).c_str());
          r = E(epoll_add(ep, p.fd, EPOLLOUT, kPipe));
          auto dup_add = E(epoll_add(ep, p.fd, EPOLLOUT, kPipe));
          k = epoll_wait(ep, ev, 8, kBoundMs);
          T("ADD OUT = %s, ADD again = %s; wait = %s", r.c_str(), dup_add.c_str(), evs(k, ev).c_str());
          epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr);  // no wait between: the record lingers
          r = E(epoll_add(ep, p.fd, EPOLLIN | EPOLLET, kPipe2));
          k = epoll_wait(ep, ev, 8, kBoundMs);
          T("DEL, ADD IN|ET with 10 unread = %s; wait = %s", r.c_str(), evs(k, ev).c_str());
          k = epoll_wait(ep, ev, 8, 0);
          T("ET, nothing new: wait(0) = %s", evs(k, ev).c_str());
          r = E(epoll_mod(ep, p.fd, EPOLLIN, kSock));
          k = epoll_wait(ep, ev, 8, kBoundMs);
          T("MOD IN (level) = %s; wait = %s", r.c_str(), evs(k, ev).c_str());
        }
        drain(p.fd, 10);
        epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr);
        ask(p, 5);
        char c[5];
        read_exact(p.fd, c, 5);
        k = epoll_wait(ep, ev, 8, 0);
        T("deleted: wait(0) = %s", evs(k, ev).c_str());
        auto r = E(epoll_add(ep, p.fd, EPOLLIN, kSock));
        k = epoll_wait(ep, ev, 8, 0);
        T("added back after a wait, nothing unread = %s; wait(0) = %s", r.c_str(), evs(k, ev).c_str());
        ask(p, 3);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("3 arrived: wait = %s", evs(k, ev).c_str());
        drain(p.fd, 3);
        stop(p);
      },
      scripted_client);
}

// Another thread sleeps on the set while this one re-arms a socket with
// bytes unread (a thread pool's EPOLLONESHOT MOD), or adds it back after a
// DEL: the kernel wakes the sleeper at once.
SCENARIO(epoll_rearm_wakes_sleeper, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_event ev[8];
        epoll_add(ep, p.fd, EPOLLIN | EPOLLONESHOT, kSock);
        ask(p, 10);
        int k = epoll_wait(ep, ev, 8, kBoundMs);
        T("10 arrived: wait = %s", evs(k, ev).c_str());
        auto asleep_while = [&](auto change) {
          std::string seen;
          std::atomic<pid_t> who{0};
          uint64_t t0 = now_ms();
          std::thread sleeper([&] {
            who = tid();
            epoll_event e[8];
            int n = epoll_wait(ep, e, 8, kBoundMs);
            seen = evs(n, e);
          });
          while (who == 0) sleep_ms(1);
          until_sleeping(who);
          change();
          sleeper.join();
          return seen + ", woken before the bound: " + yes(now_ms() - t0 < kBoundMs);
        };
        T("MOD re-arm, 10 unread: the sleeper sees %s",
          asleep_while([&] { epoll_mod(ep, p.fd, EPOLLIN | EPOLLONESHOT, kPipe); }).c_str());
        T("DEL and ADD of a disarmed one, 10 unread: the sleeper sees %s", asleep_while([&] {
                                                                             epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr);
                                                                             epoll_add(ep, p.fd, EPOLLIN | EPOLLONESHOT, kPipe2);
                                                                           }).c_str());
        epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr);
        T("ADD after DEL, 10 unread: the sleeper sees %s",
          asleep_while([&] { epoll_add(ep, p.fd, EPOLLIN, kSock); }).c_str());
        drain(p.fd, 10);
        stop(p);
      },
      scripted_client);
}

// ---------------------------------------------------------------------------
// Fresh accepted sockets added to a set before any I/O: rdmashim makes the
// kernel registration at the next wait's look (hooks_epoll.cc, deferred
// ADDs), so these check that nothing a program can see changes: readiness
// found late, edges, MOD/DEL/ONESHOT before the first wait, poll() on the
// set, a thread asleep on it, and a fork between the ADD and the wait.

PairOpts cold_pair() {
  PairOpts o;
  o.warm = false;
  return o;
}

SCENARIO(epoll_fresh_lt, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, 0);
        T("fresh, nothing sent: wait(0) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 100);
        T("wait(100) = %s", evs(k, ev).c_str());
        ask(p, 10);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer wrote 10: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("unread, level-triggered: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        k = epoll_wait(ep, ev, 8, 0);
        T("read all: wait(0) = %s", evs(k, ev).c_str());
        ask(p, 0);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer's SHUT_WR: wait(5000) = %s", evs(k, ev).c_str());
        stop(p);
      },
      scripted_client, cold_pair());
}

// The first wait sleeps: the bytes come while it does.
SCENARIO(epoll_fresh_sleep_first, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN | EPOLLRDHUP | EPOLLET, kSock);
        p.ctl.put(10);  // the client writes 100 ms from now
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, kBoundMs);
        T("asleep when the bytes came: wait(5000) = %s", evs(k, ev).c_str());
        p.ctl.sync();
        drain(p.fd, 10);
        k = epoll_wait(ep, ev, 8, 0);
        T("read all: wait(0) = %s", evs(k, ev).c_str());
        stop(p);
      },
      [](Pair& p) {
        uint64_t n = p.ctl.get();
        usleep(100 * 1000);
        std::vector<char> b(n);
        fill_pattern(n, 0, b.data(), n);
        write_all(p.fd, b.data(), n);
        p.ctl.sync();
        scripted_client(p);
      },
      cold_pair());
}

SCENARIO(epoll_fresh_et_data_first, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client wrote 10 bytes
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN | EPOLLRDHUP | EPOLLET, kSock);
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, kBoundMs);
        T("bytes there before the ADD: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("again, nothing new: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        k = epoll_wait(ep, ev, 8, 0);
        T("read all: wait(0) = %s", evs(k, ev).c_str());
        ask(p, 5);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after 5 more: wait(5000) = %s", evs(k, ev).c_str());
        drain(p.fd, 5);
        ask(p, 0);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer's SHUT_WR: wait(5000) = %s", evs(k, ev).c_str());
        stop(p);
      },
      [](Pair& p) {
        char b[10];
        fill_pattern(10, 0, b, sizeof b);
        write_all(p.fd, b, sizeof b);
        p.ctl.sync();
        scripted_client(p);
      },
      cold_pair());
}

// A client that connects and closes at once (a health check): the first
// look meets the end, which the kernel reports with EPOLLRDHUP.
SCENARIO_TCP(epoll_fresh_eof_first, 0, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client closed
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN | EPOLLRDHUP, kSock);
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, kBoundMs);
        T("the client closed before the ADD: wait(5000) = %s", evs(k, ev).c_str());
        char c;
        T("read = %s", E(read(p.fd, &c, 1)).c_str());
      },
      [](Pair& p) {
        close(p.fd);
        p.ctl.sync();
      },
      cold_pair());
}

SCENARIO(epoll_fresh_mod_del_oneshot, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_event ev[8];
        // Deleted before any wait, then added back.
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        T("DEL before any wait = %s", E(epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr)).c_str());
        T("DEL again = %s", E(epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr)).c_str());
        T("MOD after DEL = %s", E(epoll_mod(ep, p.fd, EPOLLIN, kSock)).c_str());
        int k = epoll_wait(ep, ev, 8, 0);
        T("deleted: wait(0) = %s", evs(k, ev).c_str());
        T("ADD again = %s", E(epoll_add(ep, p.fd, EPOLLIN | EPOLLONESHOT, kPipe)).c_str());
        T("ADD twice = %s", E(epoll_add(ep, p.fd, EPOLLIN, kPipe)).c_str());
        ask(p, 10);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("ONESHOT, 10 bytes: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("fired: wait(0) = %s", evs(k, ev).c_str());
        T("MOD to IN|OUT = %s", E(epoll_mod(ep, p.fd, EPOLLIN | EPOLLOUT, kZero)).c_str());
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("wait(5000) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        T("MOD to IN = %s", E(epoll_mod(ep, p.fd, EPOLLIN, kSock)).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("read all: wait(0) = %s", evs(k, ev).c_str());
        ask(p, 3);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("3 more: wait(5000) = %s", evs(k, ev).c_str());
        drain(p.fd, 3);
        stop(p);
      },
      scripted_client, cold_pair());
}

// Added, then waited on by poll() on the set, then by a thread asleep in
// epoll_wait while the bytes come.
SCENARIO(epoll_fresh_poll_and_thread, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        pollfd pf{ep, POLLIN, 0};
        auto r = E(poll(&pf, 1, 0));
        T("poll(set, 0) = %s %s", r.c_str(), pollev(pf.revents).c_str());
        p.ctl.put(10);
        pf.revents = 0;
        r = E(poll(&pf, 1, kBoundMs));
        T("poll(set, 5000) = %s %s", r.c_str(), pollev(pf.revents).c_str());
        p.ctl.sync();
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, 0);
        T("wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        int ep2 = epoll_create1(0);
        int fd2 = dup(p.fd);
        epoll_add(ep2, fd2, EPOLLIN, kPipe);
        std::thread sleeper([&] {
          set_role("server-thread");
          epoll_event e[8];
          int n = epoll_wait(ep2, e, 8, kBoundMs);
          T("asleep before the bytes came: wait(5000) = %s", evs(n, e).c_str());
        });
        usleep(50 * 1000);
        ask(p, 4);
        sleeper.join();
        drain(p.fd, 4);
        stop(p);
      },
      scripted_client, cold_pair());
}

// A program that only polls the set, never sleeping on it, and a set that
// holds the set.
SCENARIO(epoll_fresh_polled_nested, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        int outer = epoll_create1(0);
        epoll_add(outer, ep, EPOLLIN, kPipe);
        p.ctl.put(10);
        p.ctl.sync();  // written
        pollfd pf{ep, POLLIN, 0};
        uint64_t end = now_ms() + kBoundMs;
        while (poll(&pf, 1, 0) == 0 && now_ms() < end) usleep(1000);
        T("poll(set, 0) in a loop: %s", pollev(pf.revents).c_str());
        epoll_event ev[8];
        int k = epoll_wait(outer, ev, 8, kBoundMs);
        T("the outer set: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("the set: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        k = epoll_wait(outer, ev, 8, 0);
        T("read all, the outer set: wait(0) = %s", evs(k, ev).c_str());
        ask(p, 3);
        k = epoll_wait(outer, ev, 8, kBoundMs);
        T("3 more, the outer set: wait(5000) = %s", evs(k, ev).c_str());
        drain(p.fd, 3);
        stop(p);
      },
      scripted_client, cold_pair());
}

// A fork between the ADD (epoll) or accept (poll) and the first wait: the
// child waits and reads (under rdmashim its look takes the client's
// Hello); the parent, after it, finds nothing, then reads what comes next.
void fresh_fork(bool use_epoll) {
  run_pair(
      [use_epoll](Pair& p) {
        int ep = use_epoll ? epoll_create1(0) : -1;
        if (use_epoll) epoll_add(ep, p.fd, EPOLLIN, kSock);
        auto wait = [&](int ms) {
          if (!use_epoll) {
            pollfd pf{p.fd, POLLIN, 0};
            auto r = E(poll(&pf, 1, ms));
            return r + " " + pollev(pf.revents);
          }
          epoll_event ev[8];
          int k = epoll_wait(ep, ev, 8, ms);
          return evs(k, ev);
        };
        pid_t kid = spawn("server-child", [&] {
          T("child: wait(5000) = %s", wait(kBoundMs).c_str());
          drain(p.fd, 10);
          T("child read all: wait(0) = %s", wait(0).c_str());
        });
        p.ctl.put(10);
        p.ctl.sync();
        reap(kid, "child");
        T("parent after the child read: wait(0) = %s", wait(0).c_str());
        p.ctl.put(2);
        p.ctl.sync();
        T("parent, 2 more: wait(5000) = %s", wait(kBoundMs).c_str());
        char got[2], want[2];
        read_exact(p.fd, got, 2);
        fill_pattern(2, 0, want, 2);
        T("parent read the 2 bytes sent: %s", yes(memcmp(got, want, 2) == 0).c_str());
        stop(p);
      },
      scripted_client, cold_pair());
}

SCENARIO(epoll_fresh_fork, 2) { fresh_fork(true); }
SCENARIO(poll_fresh_fork, 2) { fresh_fork(false); }

SCENARIO(epoll_rdhup, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN | EPOLLRDHUP, kSock);
        epoll_event ev[8];
        ask(p, 3);
        ask(p, 0);
        T("after the peer wrote 3 and shut down writing: %s", epollev(epoll_until(ep, kSock, EPOLLRDHUP)).c_str());
        char buf[8];
        ssize_t n = read(p.fd, buf, sizeof buf);
        T("read = %s", E(n).c_str());
        auto r = E(read(p.fd, buf, sizeof buf));
        T("read = %s", r.c_str());
        int k = epoll_wait(ep, ev, 8, 0);
        T("still (level-triggered): wait(0) = %s", evs(k, ev).c_str());
        epoll_mod(ep, p.fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP, kSock);
        k = epoll_wait(ep, ev, 8, 0);
        T("with EPOLLOUT: wait(0) = %s", evs(k, ev).c_str());
        r = E(write(p.fd, "half", 4));
        T("write to the half-closed peer = %s", r.c_str());
        shutdown(p.fd, SHUT_WR);
        k = epoll_wait(ep, ev, 8, 0);
        T("after our own SHUT_WR: wait(0) = %s", evs(k, ev).c_str());
        stop(p);
      },
      [](Pair& p) {
        scripted_client(p);
        char buf[4];
        read_exact(p.fd, buf, 4);
        T("got %s", quote(buf, 4).c_str());
        T("then %s", E(read(p.fd, buf, 4)).c_str());
      });
}

SCENARIO(epoll_exclusive, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        auto r = E(epoll_add(ep, p.fd, EPOLLIN | EPOLLEXCLUSIVE, kSock));
        T("ADD EPOLLIN|EPOLLEXCLUSIVE = %s", r.c_str());
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, 0);
        T("idle wait(0) = %s", evs(k, ev).c_str());
        ask(p, 10);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("after the peer wrote 10: wait(5000) = %s", evs(k, ev).c_str());
        r = E(epoll_mod(ep, p.fd, EPOLLIN, kSock));
        T("MOD of an exclusive registration = %s", r.c_str());
        drain(p.fd, 10);
        epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr);
        r = E(epoll_add(ep, p.fd, EPOLLIN | EPOLLEXCLUSIVE | EPOLLONESHOT, kSock));
        T("ADD EPOLLEXCLUSIVE|EPOLLONESHOT = %s", r.c_str());
        // Two sets, both exclusive, both waited on by threads: data wakes at least one.
        int e1 = epoll_create1(0), e2 = epoll_create1(0);
        epoll_add(e1, p.fd, EPOLLIN | EPOLLEXCLUSIVE, 1);
        epoll_add(e2, p.fd, EPOLLIN | EPOLLEXCLUSIVE, 2);
        std::atomic<int> woke{0};
        auto waiter = [&](int e) {
          epoll_event x[2];
          if (epoll_wait(e, x, 2, 2000) > 0) woke++;
        };
        std::thread t1(waiter, e1), t2(waiter, e2);
        sleep_ms(50);
        ask(p, 4);
        t1.join();
        t2.join();
        T("two exclusive waiters, data arrived: at least one woke: %s", yes(woke >= 1).c_str());
        drain(p.fd, 4);
        stop(p);
      },
      scripted_client);
}

SCENARIO(epoll_two_sets, 2) {
  run_pair(
      [](Pair& p) {
        int lt = epoll_create1(0), et = epoll_create1(0);
        epoll_add(lt, p.fd, EPOLLIN, 0xA1A1A1A1A1A1A1A1ull);
        epoll_add(et, p.fd, EPOLLIN | EPOLLET, 0xB2B2B2B2B2B2B2B2ull);
        epoll_event ev[8];
        ask(p, 10);
        int k = epoll_wait(lt, ev, 8, kBoundMs);
        T("LT set: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(et, ev, 8, kBoundMs);
        T("ET set: wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(lt, ev, 8, 0);
        T("LT set again: wait(0) = %s", evs(k, ev).c_str());
        k = epoll_wait(et, ev, 8, 0);
        T("ET set again: wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        k = epoll_wait(lt, ev, 8, 0);
        T("read all: LT wait(0) = %s", evs(k, ev).c_str());
        k = epoll_wait(et, ev, 8, 0);
        T("read all: ET wait(0) = %s", evs(k, ev).c_str());
        epoll_ctl(lt, EPOLL_CTL_DEL, p.fd, nullptr);
        ask(p, 2);
        k = epoll_wait(et, ev, 8, kBoundMs);
        T("deleted from LT only; 2 more: ET wait(5000) = %s", evs(k, ev).c_str());
        k = epoll_wait(lt, ev, 8, 0);
        T("LT wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 2);
        stop(p);
      },
      scripted_client);
}

SCENARIO(epoll_nested, 2) {
  run_pair(
      [](Pair& p) {
        int inner = epoll_create1(0), outer = epoll_create1(0);
        int a[2];
        pipe(a);
        epoll_add(inner, p.fd, EPOLLIN, kSock);
        auto r = E(epoll_add(outer, inner, EPOLLIN, 0x1111));
        T("ADD the inner set to the outer = %s", r.c_str());
        epoll_add(outer, a[0], EPOLLIN, kPipe);
        epoll_event ev[8];
        int k = epoll_wait(outer, ev, 8, 0);
        T("idle outer wait(0) = %s", evs(k, ev).c_str());
        pollfd pf{inner, POLLIN, 0};
        k = poll(&pf, 1, 0);
        T("idle poll(inner) = %s", pres(k, pf).c_str());
        ask(p, 10);
        k = epoll_wait(outer, ev, 8, kBoundMs);
        T("after the peer wrote 10: outer wait(5000) = %s", evs(k, ev).c_str());
        k = poll(&pf, 1, 0);
        T("poll(inner) = %s", pres(k, pf).c_str());
        k = epoll_wait(inner, ev, 8, 0);
        T("inner wait(0) = %s", evs(k, ev).c_str());
        write(a[1], "p", 1);
        k = epoll_wait(outer, ev, 8, 0);
        T("pipe written too: outer wait(0) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        char c;
        read(a[0], &c, 1);
        k = epoll_wait(outer, ev, 8, 0);
        T("all read: outer wait(0) = %s", evs(k, ev).c_str());
        p.ctl.put(5);  // written after a pause: the outer wait sleeps first
        k = epoll_wait(outer, ev, 8, kBoundMs);
        T("socket written during the wait: outer wait(5000) = %s", evs(k, ev).c_str());
        p.ctl.sync();
        drain(p.fd, 5);
        stop(p);
      },
      [](Pair& p) {
        uint64_t n = p.ctl.get();
        write_all(p.fd, std::string(n, 'x').data(), n);
        p.ctl.sync();
        n = p.ctl.get();
        sleep_ms(50);
        write_all(p.fd, std::string(n, 'y').data(), n);
        p.ctl.sync();
        p.ctl.get();
      });
}

SCENARIO(epoll_mixed_pipe, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        int a[2];
        pipe(a);
        int efd = eventfd(0, EFD_NONBLOCK);
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        epoll_add(ep, a[0], EPOLLIN, kPipe);
        epoll_add(ep, efd, EPOLLIN, kPipe2);
        epoll_add(ep, a[1], EPOLLOUT | EPOLLET, kZero);
        epoll_event ev[8];
        int k = epoll_wait(ep, ev, 8, 0);
        T("idle (the pipe's write end is writable once, edge): wait(0) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, 0);
        T("idle: wait(0) = %s", evs(k, ev).c_str());
        write(a[1], "p", 1);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("pipe written: wait(5000) = %s", evs(k, ev).c_str());
        ask(p, 10);
        epoll_until(ep, kSock, EPOLLIN);
        k = epoll_wait(ep, ev, 8, 0);
        T("pipe and socket: wait(0) = %s", evs(k, ev).c_str());
        uint64_t one = 1;
        write(efd, &one, 8);
        k = epoll_wait(ep, ev, 8, 0);
        T("and the eventfd: wait(0) = %s", evs(k, ev).c_str());
        char c;
        read(a[0], &c, 1);
        read(efd, &one, 8);
        drain(p.fd, 10);
        k = epoll_wait(ep, ev, 8, 100);
        T("all read: wait(100) = %s", evs(k, ev).c_str());
        std::thread t([&] {
          sleep_ms(50);
          uint64_t v = 1;
          write(efd, &v, 8);
        });
        k = epoll_wait(ep, ev, 8, kBoundMs);
        t.join();
        T("eventfd written during the wait: wait(5000) = %s", evs(k, ev).c_str());
        read(efd, &one, 8);
        p.ctl.put(5);
        k = epoll_wait(ep, ev, 8, kBoundMs);
        T("socket written during the wait: wait(5000) = %s", evs(k, ev).c_str());
        p.ctl.sync();
        drain(p.fd, 5);
        stop(p);
      },
      [](Pair& p) {
        uint64_t n = p.ctl.get();
        write_all(p.fd, std::string(n, 'x').data(), n);
        p.ctl.sync();
        n = p.ctl.get();
        sleep_ms(50);
        write_all(p.fd, std::string(n, 'y').data(), n);
        p.ctl.sync();
        p.ctl.get();
      });
}

SCENARIO(epoll_maxevents_fairness, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        int a[2], b[2];
        pipe(a);
        pipe(b);
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        epoll_add(ep, a[0], EPOLLIN, kPipe);
        epoll_add(ep, b[0], EPOLLIN, kPipe2);
        write(a[1], "a", 1);
        write(b[1], "b", 1);
        ask(p, 10);
        epoll_until(ep, kSock, EPOLLIN);
        std::vector<uint64_t> seen;
        epoll_event ev[1];
        for (int i = 0; i < 3; ++i) {
          int k = epoll_wait(ep, ev, 1, 0);
          if (k == 1) seen.push_back(ev[0].data.u64);
          else T("wait(maxevents 1) #%d = %s", i, E(k).c_str());
        }
        std::string s = sorted_hex(seen);
        T("3 x wait(maxevents 1), all ready and level-triggered: each once:%s", s.c_str());
        drain(p.fd, 10);
        stop(p);
      },
      scripted_client);
}

// The same with waits that may sleep (a timeout): without spinning, a wait
// goes to sleep at once when nothing of ours is ready, but one that finds
// ours ready still looks at the kernel's list first, as before.
SCENARIO(epoll_maxevents_fairness_wait, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        int a[2], b[2];
        if (pipe(a) != 0 || pipe(b) != 0) fatal("pipe");
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        epoll_add(ep, a[0], EPOLLIN, kPipe);
        epoll_add(ep, b[0], EPOLLIN, kPipe2);
        if (write(a[1], "a", 1) != 1 || write(b[1], "b", 1) != 1) fatal("write");
        ask(p, 10);
        epoll_until(ep, kSock, EPOLLIN);
        std::vector<uint64_t> seen;
        epoll_event ev[1];
        for (int i = 0; i < 3; ++i) {
          int k = epoll_wait(ep, ev, 1, kBoundMs);
          if (k == 1) seen.push_back(ev[0].data.u64);
          else T("wait(maxevents 1, 5000) #%d = %s", i, E(k).c_str());
        }
        std::string s = sorted_hex(seen);
        T("3 x wait(maxevents 1, 5000), all ready and level-triggered: each once:%s", s.c_str());
        // Only the pipes: the sleep itself reports them.
        drain(p.fd, 10);
        seen.clear();
        for (int i = 0; i < 2; ++i) {
          int k = epoll_wait(ep, ev, 1, kBoundMs);
          if (k == 1) seen.push_back(ev[0].data.u64);
          else T("pipes: wait(maxevents 1, 5000) #%d = %s", i, E(k).c_str());
        }
        s = sorted_hex(seen);
        T("socket drained: 2 x wait(maxevents 1, 5000):%s", s.c_str());
        stop(p);
      },
      scripted_client);
}

// The peer's FIN reaches an upgraded socket on its TCP side only: a program
// asleep in epoll_wait with ring-side interest hears of it (the kernel names
// the descriptor, the scan then looks at that one TCP side), once if
// edge-triggered, and a level-triggered one keeps its turn when plain
// descriptors fill maxevents.
void fin_while_asleep(bool et) {
  run_pair(
      [et](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN | EPOLLRDHUP | (et ? EPOLLET : 0u), kSock);
        epoll_event ev[4];
        int k = epoll_wait(ep, ev, 4, 0);
        T("idle: wait(0) = %s", evs(k, ev).c_str());
        p.ctl.put(0);  // the peer shuts down writing 100 ms from now
        k = epoll_wait(ep, ev, 4, kBoundMs);
        T("asleep when the peer shut down writing: wait(5000) = %s", evs(k, ev).c_str());
        p.ctl.sync();
        k = epoll_wait(ep, ev, 4, 0);
        T("again: wait(0) = %s", evs(k, ev).c_str());
        int a[2], b[2];
        if (pipe(a) != 0 || pipe(b) != 0) fatal("pipe");
        epoll_add(ep, a[0], EPOLLIN, kPipe);
        epoll_add(ep, b[0], EPOLLIN, kPipe2);
        if (write(a[1], "a", 1) != 1 || write(b[1], "b", 1) != 1) fatal("write");
        std::vector<uint64_t> seen;
        for (int i = 0; i < 3; ++i) {
          k = epoll_wait(ep, ev, 1, 0);
          if (k == 1) seen.push_back(ev[0].data.u64);
          else T("wait(maxevents 1) #%d = %s", i, E(k).c_str());
        }
        std::string s = sorted_hex(seen);
        T("with two readable pipes, 3 x wait(maxevents 1):%s", s.c_str());
        stop(p);
      },
      [](Pair& p) {
        for (uint64_t n = p.ctl.get(); n != UINT64_MAX; n = p.ctl.get()) {
          sleep_ms(100);
          shutdown(p.fd, SHUT_WR);
          p.ctl.sync();
        }
      });
}

SCENARIO(epoll_fin_asleep_lt, 2) { fin_while_asleep(false); }
SCENARIO(epoll_fin_asleep_et, 2) { fin_while_asleep(true); }

SCENARIO(epoll_timeouts, 2) {
  run_pair(
      [](Pair& p) {
        int ep = epoll_create1(0);
        epoll_add(ep, p.fd, EPOLLIN, kSock);
        epoll_event ev[8];
        uint64_t t0 = now_ms();
        int k = epoll_wait(ep, ev, 8, 100);
        T("epoll_wait(100) = %s; %s", evs(k, ev).c_str(), waited(t0, 90).c_str());
        t0 = now_ms();
        k = epoll_pwait(ep, ev, 8, 100, nullptr);
        T("epoll_pwait(100, no mask) = %s; %s", evs(k, ev).c_str(), waited(t0, 90).c_str());
        timespec zero{0, 0}, tenth{0, 100000000}, bad{0, 1000000000};
        k = epoll_pwait2(ep, ev, 8, &zero, nullptr);
        T("epoll_pwait2(0) = %s", evs(k, ev).c_str());
        t0 = now_ms();
        k = epoll_pwait2(ep, ev, 8, &tenth, nullptr);
        T("epoll_pwait2(100 ms) = %s; %s", evs(k, ev).c_str(), waited(t0, 90).c_str());
        auto r = E(epoll_pwait2(ep, ev, 8, &bad, nullptr));
        T("epoll_pwait2(tv_nsec 1e9) = %s", r.c_str());
        ask(p, 10);
        k = epoll_pwait2(ep, ev, 8, nullptr, nullptr);
        T("after the peer wrote 10: epoll_pwait2(no timeout) = %s", evs(k, ev).c_str());
        k = epoll_wait(ep, ev, 8, -1);
        T("epoll_wait(-1) = %s", evs(k, ev).c_str());
        drain(p.fd, 10);
        stop(p);
      },
      scripted_client);
}

// ---------------------------------------------------------------------------
// Signal masks: the mask a call installs for its duration is honoured.

namespace {

using Waiter = std::function<int(int ms, const sigset_t* mask)>;

void sigmask_body(const Waiter& wait) {
  install_counter(SIGUSR1, false);
  std::atomic<int>& n = sig_count(SIGUSR1);
  n = 0;
  sigset_t usr1, none, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigemptyset(&none);
  pthread_t self = pthread_self();

  pthread_sigmask(SIG_BLOCK, &usr1, &old);
  pthread_kill(self, SIGUSR1);
  int k = wait(100, &usr1);
  std::string r = E(k);
  T("pending, blocked by the call's mask: = %s; handler ran during the call: %s", r.c_str(), yes(n > 0).c_str());
  pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
  T("after unblocking: handler ran: %s", yes(n == 1).c_str());

  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  pthread_kill(self, SIGUSR1);
  k = wait(kBoundMs, &none);
  r = E(k);
  T("pending, unblocked by the call's mask: = %s; handler ran: %s", r.c_str(), yes(n == 2).c_str());
  pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);

  // Sent while the call sleeps.
  pid_t me = tid();
  std::thread t([&] {
    until_sleeping(me);
    pthread_kill(self, SIGUSR1);
  });
  k = wait(600, &usr1);
  r = E(k);
  t.join();
  T("sent during the wait, blocked by the call's mask: = %s; handler ran after the call: %s", r.c_str(),
    yes(n == 3).c_str());

  std::thread t2([&] {
    until_sleeping(me);
    pthread_kill(self, SIGUSR1);
  });
  k = wait(kBoundMs, &none);
  r = E(k);
  t2.join();
  T("sent during the wait, not blocked: = %s; handler ran: %s", r.c_str(), yes(n == 4).c_str());
}

void sigmask_scenario(const std::function<Waiter(Pair&)>& make) {
  run_pair(
      [&](Pair& p) {
        Waiter w = make(p);
        sigmask_body(w);
        ask(p, 3);
        int k = w(kBoundMs, nullptr);
        T("data ready: = %s", E(k).c_str());
        drain(p.fd, 3);
        stop(p);
      },
      scripted_client);
}

}  // namespace

SCENARIO(sigmask_ppoll, 2) {
  sigmask_scenario([](Pair& p) -> Waiter {
    int fd = p.fd;
    return [fd](int ms, const sigset_t* mask) {
      pollfd pf{fd, POLLIN, 0};
      timespec ts{ms / 1000, (ms % 1000) * 1000000L};
      return ppoll(&pf, 1, &ts, mask);
    };
  });
}

SCENARIO(sigmask_pselect, 2) {
  sigmask_scenario([](Pair& p) -> Waiter {
    int fd = p.fd;
    return [fd](int ms, const sigset_t* mask) {
      fd_set rs;
      FD_ZERO(&rs);
      FD_SET(fd, &rs);
      timespec ts{ms / 1000, (ms % 1000) * 1000000L};
      return pselect(fd + 1, &rs, nullptr, nullptr, &ts, mask);
    };
  });
}

SCENARIO(sigmask_epoll_pwait, 2) {
  sigmask_scenario([](Pair& p) -> Waiter {
    int ep = epoll_create1(0);
    epoll_add(ep, p.fd, EPOLLIN, kSock);
    return [ep](int ms, const sigset_t* mask) {
      epoll_event ev[4];
      return epoll_pwait(ep, ev, 4, ms, mask);
    };
  });
}

SCENARIO(sigmask_epoll_pwait2, 2) {
  sigmask_scenario([](Pair& p) -> Waiter {
    int ep = epoll_create1(0);
    epoll_add(ep, p.fd, EPOLLIN, kSock);
    return [ep](int ms, const sigset_t* mask) {
      epoll_event ev[4];
      timespec ts{ms / 1000, (ms % 1000) * 1000000L};
      return epoll_pwait2(ep, ev, 4, &ts, mask);
    };
  });
}

// ---------------------------------------------------------------------------
// Event loops: a non-blocking echo server for 3 concurrent clients, the way
// real servers are written.

namespace {

enum class Loop { kEpollLT, kEpollET, kPoll, kSelect };

struct Conn {
  int fd;
  std::string out;
  bool eof = false;
};

void echo_client(uint16_t port, uint64_t seed) {
  int fd = connect_to(port);
  uint64_t sent = 0;
  bool ok = true;
  uint64_t state = seed;
  std::vector<char> msg, back;
  for (int i = 0; i < 40; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    size_t len = 1 + (state >> 33) % 20000;
    msg.resize(len);
    back.resize(len);
    fill_pattern(seed, sent, msg.data(), len);
    write_all(fd, msg.data(), len);
    read_exact(fd, back.data(), len);
    ok = ok && msg == back;
    sent += len;
  }
  T("40 messages echoed intact: %s (%llu bytes)", yes(ok).c_str(), static_cast<unsigned long long>(sent));
  shutdown(fd, SHUT_WR);
  char c;
  auto r = E(read(fd, &c, 1));
  T("after SHUT_WR: read = %s", r.c_str());
  close(fd);
}

void echo_loop(Loop kind) {
  set_role("server");
  uint16_t port;
  int lfd = make_listener(&port, SOCK_NONBLOCK);
  std::vector<pid_t> kids;
  for (int i = 0; i < 3; ++i) kids.push_back(spawn("client" + std::to_string(i), [&, i] {
    close(lfd);
    echo_client(port, 100 + i);
  }));
  bool et = kind == Loop::kEpollET;
  int ep = -1;
  if (kind == Loop::kEpollLT || et) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_add(ep, lfd, EPOLLIN | (et ? uint32_t{EPOLLET} : 0u), static_cast<uint64_t>(lfd));
  }
  std::vector<Conn> conns;
  int accepted = 0, closed = 0, errors = 0;
  uint64_t echoed = 0;
  uint64_t end = now_ms() + 8000;
  auto find = [&](int fd) -> Conn* {
    for (auto& c : conns)
      if (c.fd == fd) return &c;
    return nullptr;
  };
  auto interest = [&](Conn& c) -> uint32_t {
    return (c.eof ? 0u : uint32_t{EPOLLIN}) | (c.out.empty() ? 0u : uint32_t{EPOLLOUT});
  };
  // Returns false when the connection is finished and closed.
  auto service = [&](Conn& c, bool readable) -> bool {
    char buf[65536];
    while (readable && !c.eof) {
      ssize_t n = read(c.fd, buf, sizeof buf);
      if (n > 0) {
        c.out.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        c.eof = true;
      } else if (errno == EAGAIN) {
        break;
      } else if (errno != EINTR) {
        T("read error %s", ename(errno));
        errors++;
        c.eof = true;
        c.out.clear();
      }
      if (!et) break;  // level-triggered: one read per readiness
    }
    while (!c.out.empty()) {
      ssize_t n = write(c.fd, c.out.data(), c.out.size());
      if (n > 0) {
        echoed += static_cast<uint64_t>(n);
        c.out.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && errno == EAGAIN) {
        break;
      } else if (n < 0 && errno != EINTR) {
        T("write error %s", ename(errno));
        errors++;
        c.out.clear();
      }
    }
    if (c.eof && c.out.empty()) {
      close(c.fd);
      closed++;
      return false;
    }
    if (ep >= 0 && !et) epoll_mod(ep, c.fd, interest(c), static_cast<uint64_t>(c.fd));
    return true;
  };
  auto accept_all = [&] {
    for (;;) {
      int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK);
      if (fd < 0) break;
      accepted++;
      conns.push_back(Conn{fd, {}, false});
      if (ep >= 0) {
        uint32_t ev = et ? (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET) : EPOLLIN;
        epoll_add(ep, fd, ev, static_cast<uint64_t>(fd));
      }
      if (!et) break;
    }
  };
  auto remove = [&](int fd) {
    conns.erase(std::remove_if(conns.begin(), conns.end(), [&](Conn& c) { return c.fd == fd; }), conns.end());
  };
  while (closed < 3 && now_ms() < end) {
    std::vector<std::pair<int, uint32_t>> ready;  // fd, EPOLLIN/EPOLLOUT-ish
    if (ep >= 0) {
      epoll_event ev[16];
      int n = epoll_wait(ep, ev, 16, 1000);
      for (int i = 0; i < n; ++i) {
        ready.push_back({static_cast<int>(ev[i].data.u64), static_cast<uint32_t>(ev[i].events)});
      }
    } else if (kind == Loop::kPoll) {
      std::vector<pollfd> f{{lfd, POLLIN, 0}};
      for (auto& c : conns) f.push_back({c.fd, static_cast<short>(interest(c)), 0});
      int n = poll(f.data(), f.size(), 1000);
      for (size_t i = 0; n > 0 && i < f.size(); ++i)
        if (f[i].revents) ready.push_back({f[i].fd, static_cast<uint32_t>(f[i].revents)});
    } else {
      fd_set rs, ws;
      FD_ZERO(&rs);
      FD_ZERO(&ws);
      FD_SET(lfd, &rs);
      int maxfd = lfd;
      for (auto& c : conns) {
        if (!c.eof) FD_SET(c.fd, &rs);
        if (!c.out.empty()) FD_SET(c.fd, &ws);
        maxfd = std::max(maxfd, c.fd);
      }
      timeval tv{1, 0};
      int n = select(maxfd + 1, &rs, &ws, nullptr, &tv);
      if (n > 0) {
        if (FD_ISSET(lfd, &rs)) ready.push_back({lfd, EPOLLIN});
        for (auto& c : conns) {
          uint32_t e = (FD_ISSET(c.fd, &rs) ? uint32_t{EPOLLIN} : 0u) | (FD_ISSET(c.fd, &ws) ? uint32_t{EPOLLOUT} : 0u);
          if (e) ready.push_back({c.fd, e});
        }
      }
    }
    for (auto& [fd, e] : ready) {
      if (fd == lfd) {
        accept_all();
        continue;
      }
      Conn* c = find(fd);
      if (!c) continue;
      bool readable = (e & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0;
      if (!service(*c, readable)) remove(fd);
    }
  }
  T("accepted %d, closed %d after EOF, errors %d, echoed %llu bytes", accepted, closed, errors,
    static_cast<unsigned long long>(echoed));
  for (int i = 0; i < 3; ++i) reap(kids[i], ("client" + std::to_string(i)).c_str());
}

}  // namespace

SCENARIO(loop_epoll_lt_echo, 6) { echo_loop(Loop::kEpollLT); }
SCENARIO(loop_epoll_et_echo, 6) { echo_loop(Loop::kEpollET); }
SCENARIO(loop_poll_echo, 6) { echo_loop(Loop::kPoll); }
SCENARIO(loop_select_echo, 6) { echo_loop(Loop::kSelect); }
