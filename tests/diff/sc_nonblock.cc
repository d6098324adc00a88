// Non-blocking I/O, per-call flags, socket options and queue sizes.
#include "sc_common.h"

using namespace diff;

namespace {

// Writes pattern bytes (stream `seed`) in `chunk`-sized calls with `flags`
// until the call fails; returns how many bytes were accepted, *err the errno
// that ended it (0 if the cap was reached first).
uint64_t fill_until_error(int fd, uint64_t seed, size_t chunk, int flags, int* err, bool use_send = true) {
  std::vector<uint8_t> buf(chunk);
  uint64_t total = 0;
  const uint64_t cap = 512ull << 20;
  *err = 0;
  while (total < cap) {
    fill_pattern(seed, total, buf.data(), chunk);
    ssize_t n = use_send ? send(fd, buf.data(), chunk, flags) : write(fd, buf.data(), chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return total;
    }
    total += static_cast<uint64_t>(n);
  }
  return total;
}

// The peer's half of a fill: reads exactly what was accepted, checks it is
// the pattern, and that nothing more is there.
void drain_accepted(Pair& p, uint64_t seed) {
  uint64_t n = p.ctl.get();
  uint64_t h = kFnvInit;
  std::vector<uint8_t> buf(65536);
  for (uint64_t got = 0; got < n;) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(buf.size(), n - got));
    read_exact(p.fd, buf.data(), k);
    h = fnv(h, buf.data(), k);
    got += k;
  }
  T("read exactly what the writer said it accepted; pattern intact: %s", yes(h == pattern_sum(seed, n)).c_str());
  char c;
  auto r = E(recv(p.fd, &c, 1, MSG_DONTWAIT));
  T("then recv(MSG_DONTWAIT) = %s", r.c_str());
}

}  // namespace

SCENARIO(nonblock_fcntl_eagain, 2) {
  run_pair(
      [](Pair& p) {
        T("O_NONBLOCK before: %s", yes(is_nonblock(p.fd)).c_str());
        auto r = E(set_nonblock(p.fd, true));
        T("F_SETFL O_NONBLOCK = %s; O_NONBLOCK now: %s", r.c_str(), yes(is_nonblock(p.fd)).c_str());
        char buf[64];
        r = E(read(p.fd, buf, sizeof buf));
        T("read on empty = %s", r.c_str());
        r = E(recv(p.fd, buf, sizeof buf, 0));
        T("recv on empty = %s", r.c_str());
        iovec iov{buf, sizeof buf};
        r = E(readv(p.fd, &iov, 1));
        T("readv on empty = %s", r.c_str());
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        r = E(recvmsg(p.fd, &m, 0));
        T("recvmsg on empty = %s", r.c_str());
        r = E(recvfrom(p.fd, buf, sizeof buf, 0, nullptr, nullptr));
        T("recvfrom on empty = %s", r.c_str());
        p.ctl.sync();  // 1: the client writes 10 bytes
        p.ctl.sync();  // 2: written
        T("poll after the peer wrote 10 bytes: %s", pollev(poll_until(p.fd, POLLIN, POLLIN)).c_str());
        ssize_t n = read(p.fd, buf, sizeof buf);
        T("read = %s", Rn(n, buf).c_str());
        r = E(read(p.fd, buf, sizeof buf));
        T("read again = %s", r.c_str());
        r = E(set_nonblock(p.fd, false));
        T("F_SETFL ~O_NONBLOCK = %s; O_NONBLOCK now: %s", r.c_str(), yes(is_nonblock(p.fd)).c_str());
        p.ctl.sync();  // 3: the client writes 5 bytes after this
        n = read(p.fd, buf, sizeof buf);
        T("blocking read = %s", Rn(n, buf).c_str());
      },
      [](Pair& p) {
        p.ctl.sync();
        write_all(p.fd, "0123456789", 10);
        p.ctl.sync();
        p.ctl.sync();
        write_all(p.fd, "abcde", 5);
        T("done");
      });
}

SCENARIO(nonblock_sock_nonblock, 2) {
  PairOpts o;
  o.accept_flags = SOCK_NONBLOCK;
  o.socket_flags = SOCK_NONBLOCK;
  run_pair(
      [](Pair& p) {
        T("accept4(SOCK_NONBLOCK): O_NONBLOCK: %s", yes(is_nonblock(p.fd)).c_str());
        char buf[64];
        auto r = E(recv(p.fd, buf, sizeof buf, 0));
        T("recv on empty = %s", r.c_str());
        p.ctl.sync();
        p.ctl.sync();
        T("poll: %s", pollev(poll_until(p.fd, POLLIN, POLLIN)).c_str());
        ssize_t n = recv(p.fd, buf, sizeof buf, 0);
        T("recv = %s", Rn(n, buf).c_str());
        r = E(recv(p.fd, buf, sizeof buf, 0));
        T("recv again = %s", r.c_str());
        r = E(send(p.fd, "pong", 4, 0));
        T("send = %s", r.c_str());
      },
      [](Pair& p) {
        T("socket(SOCK_NONBLOCK): O_NONBLOCK: %s", yes(is_nonblock(p.fd)).c_str());
        char buf[64];
        auto r = E(read(p.fd, buf, sizeof buf));
        T("read on empty = %s", r.c_str());
        p.ctl.sync();
        r = E(send(p.fd, "ping", 4, 0));
        T("send = %s", r.c_str());
        p.ctl.sync();
        T("poll: %s", pollev(poll_until(p.fd, POLLIN, POLLIN)).c_str());
        read_exact(p.fd, buf, 4);
        T("got %s", quote(buf, 4).c_str());
      },
      o);
}

SCENARIO(nonblock_fionbio, 2) {
  run_pair(
      [](Pair& p) {
        int on = 1;
        auto r = E(ioctl(p.fd, FIONBIO, &on));
        T("ioctl(FIONBIO, 1) = %s; O_NONBLOCK: %s", r.c_str(), yes(is_nonblock(p.fd)).c_str());
        char buf[64];
        r = E(read(p.fd, buf, sizeof buf));
        T("read on empty = %s", r.c_str());
        int off = 0;
        r = E(ioctl(p.fd, FIONBIO, &off));
        T("ioctl(FIONBIO, 0) = %s; O_NONBLOCK: %s", r.c_str(), yes(is_nonblock(p.fd)).c_str());
        p.ctl.sync();  // the client writes after this; the read blocks until then
        ssize_t n = read(p.fd, buf, sizeof buf);
        T("blocking read = %s", Rn(n, buf).c_str());
      },
      [](Pair& p) {
        p.ctl.sync();
        write_all(p.fd, "after-fionbio", 13);
      });
}

SCENARIO(nonblock_write_full_eagain, 2) {
  run_pair(
      [](Pair& p) {
        set_nonblock(p.fd, true);
        int err = 0;
        uint64_t n = fill_until_error(p.fd, 41, 16384, 0, &err, false);
        T("write until error: ended with %s; accepted > 0: %s", err ? ename(err) : "cap reached",
          yes(n > 0).c_str());
        p.ctl.put(n);
        p.ctl.sync();  // the client has read everything
        T("poll after the peer drained: %s", pollev(poll_until(p.fd, POLLOUT, POLLOUT)).c_str());
        auto r = E(write(p.fd, "end", 3));
        T("write = %s", r.c_str());
      },
      [](Pair& p) {
        drain_accepted(p, 41);
        p.ctl.sync();
        char b[3];
        read_exact(p.fd, b, 3);
        T("got %s", quote(b, 3).c_str());
      });
}

SCENARIO(nonblock_msg_dontwait, 2) {
  run_pair(
      [](Pair& p) {
        char buf[64];
        auto r = E(recv(p.fd, buf, sizeof buf, MSG_DONTWAIT));
        T("recv(MSG_DONTWAIT) on empty = %s", r.c_str());
        T("O_NONBLOCK (must stay off): %s", yes(is_nonblock(p.fd)).c_str());
        int err = 0;
        uint64_t n = fill_until_error(p.fd, 42, 10000, MSG_DONTWAIT, &err);
        T("send(MSG_DONTWAIT) until error: ended with %s; accepted > 0: %s", err ? ename(err) : "cap reached",
          yes(n > 0).c_str());
        p.ctl.put(n);
        p.ctl.sync();  // drained; the client then writes 6 bytes
        ssize_t k = recv(p.fd, buf, sizeof buf, 0);
        T("blocking recv = %s", Rn(k, buf).c_str());
      },
      [](Pair& p) {
        drain_accepted(p, 42);
        p.ctl.sync();
        write_all(p.fd, "direct", 6);
      });
}

SCENARIO(nonblock_connect_einprogress, 2) {
  set_role("server");
  Pair s;
  s.lfd = make_listener(&s.port);
  Ctl cc;
  make_ctl(&s.ctl, &cc);
  uint16_t port = s.port;
  pid_t pid = spawn("client", [&] {
    close(s.ctl.fd);
    close(s.lfd);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    auto r = E(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a));
    T("connect = %s", r.c_str());
    T("poll(POLLOUT): %s", pollev(poll_until(fd, POLLOUT, POLLOUT)).c_str());
    int err = -1;
    socklen_t len = sizeof err;
    r = E(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len));
    T("SO_ERROR = %s, value %s", r.c_str(), err ? ename(err) : "0");
    r = E(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a));
    T("connect again = %s", r.c_str());
    r = E(write(fd, "hello", 5));
    T("write = %s", r.c_str());
    T("poll(POLLIN): %s", pollev(poll_until(fd, POLLIN, POLLIN)).c_str());
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf);
    T("read = %s", Rn(n, buf).c_str());
    r = E(read(fd, buf, sizeof buf));
    T("read again = %s", r.c_str());
    uint64_t h = send_stream(fd, 7, 300000);
    T("sent 300000, sum ok: %s", yes(h == pattern_sum(7, 300000)).c_str());
    h = recv_stream(fd, 8, 300000);
    T("received 300000, sum ok: %s", yes(h == pattern_sum(8, 300000)).c_str());
    cc.sync();
    close(fd);
  });
  close(cc.fd);
  int fd = accept_one(s.lfd);
  char buf[5];
  read_exact(fd, buf, 5);
  T("got %s", quote(buf, 5).c_str());
  write_all(fd, "world", 5);
  uint64_t h = recv_stream(fd, 7, 300000);
  T("received 300000, sum ok: %s", yes(h == pattern_sum(7, 300000)).c_str());
  h = send_stream(fd, 8, 300000);
  T("sent 300000, sum ok: %s", yes(h == pattern_sum(8, 300000)).c_str());
  s.ctl.sync();
  reap(pid, "client");
}

SCENARIO(nonblock_connect_epoll, 2) {
  set_role("server");
  Pair s;
  s.lfd = make_listener(&s.port);
  uint16_t port = s.port;
  pid_t pid = spawn("client", [&] {
    close(s.lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    set_nonblock(fd, true);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    auto r = E(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a));
    T("connect = %s", r.c_str());
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_add(ep, fd, EPOLLOUT, 0xC0FFEE);
    T("epoll EPOLLOUT: %s", epollev(epoll_until(ep, 0xC0FFEE, EPOLLOUT)).c_str());
    int err = -1;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    T("SO_ERROR value %s", err ? ename(err) : "0");
    epoll_mod(ep, fd, EPOLLIN, 0xC0FFEE);
    r = E(send(fd, "ping", 4, 0));
    T("send = %s", r.c_str());
    T("epoll EPOLLIN: %s", epollev(epoll_until(ep, 0xC0FFEE, EPOLLIN)).c_str());
    char buf[16];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    T("recv = %s", Rn(n, buf).c_str());
    epoll_event ev[4];
    int k = epoll_wait(ep, ev, 4, 0);
    T("epoll_wait(0) after reading = %s", evs(k, ev).c_str());
  });
  int fd = accept_one(s.lfd);
  char buf[4];
  read_exact(fd, buf, 4);
  write_all(fd, "pong", 4);
  reap(pid, "client");
  close(fd);
}

SCENARIO(nonblock_connect_refused, 0) {
  set_role("client");
  uint16_t port;
  int l = make_listener(&port);
  close(l);  // nothing listens there any more
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  auto r = E(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a));
  T("connect = %s", r.c_str());
  T("poll(POLLIN|POLLOUT) until POLLERR: %s", pollev(poll_until(fd, POLLIN | POLLOUT, POLLERR)).c_str());
  int err = -1;
  socklen_t len = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  T("SO_ERROR value %s", err ? ename(err) : "0");
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  T("SO_ERROR again %s", err ? ename(err) : "0");
  char c;
  r = E(read(fd, &c, 1));
  T("read = %s", r.c_str());
  r = E(send(fd, "x", 1, MSG_NOSIGNAL));
  T("send = %s", r.c_str());
  close(fd);
}

SCENARIO(msg_peek, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();
        poll_until(p.fd, POLLIN, POLLIN);
        char buf[16];
        ssize_t n = recv(p.fd, buf, 3, MSG_PEEK);
        T("recv(3, MSG_PEEK) = %s", Rn(n, buf).c_str());
        n = recv(p.fd, buf, sizeof buf, MSG_PEEK);
        T("recv(16, MSG_PEEK) = %s", Rn(n, buf).c_str());
        int avail = -1;
        ioctl(p.fd, FIONREAD, &avail);
        T("FIONREAD after peeking = %d", avail);
        n = recv(p.fd, buf, 4, 0);
        T("recv(4) = %s", Rn(n, buf).c_str());
        n = recv(p.fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
        T("recv(16, MSG_PEEK|MSG_DONTWAIT) = %s", Rn(n, buf).c_str());
        n = recv(p.fd, buf, sizeof buf, 0);
        T("recv(16) = %s", Rn(n, buf).c_str());
        auto r = E(recv(p.fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT));
        T("recv(MSG_PEEK|MSG_DONTWAIT) on empty = %s", r.c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client shut down writing
        poll_until(p.fd, POLLIN, POLLIN);
        r = E(recv(p.fd, buf, sizeof buf, MSG_PEEK));
        T("recv(MSG_PEEK) at EOF = %s", r.c_str());
        r = E(recv(p.fd, buf, sizeof buf, 0));
        T("recv at EOF = %s", r.c_str());
      },
      [](Pair& p) {
        write_all(p.fd, "abcdef", 6);
        p.ctl.sync();
        p.ctl.sync();
        shutdown(p.fd, SHUT_WR);
        p.ctl.sync();
      });
}

SCENARIO(msg_waitall, 2) {
  run_pair(
      [](Pair& p) {
        char buf[64];
        // The client writes 3 x 10 bytes with pauses: one call gets all 30.
        ssize_t n = recv(p.fd, buf, 30, MSG_WAITALL);
        T("recv(30, MSG_WAITALL) = %s", Rn(n, buf).c_str());
        p.ctl.sync();  // the client writes 5 bytes and shuts down writing
        n = recv(p.fd, buf, 30, MSG_WAITALL);
        T("recv(30, MSG_WAITALL) with EOF after 5 = %s", Rn(n, buf).c_str());
        auto r = E(recv(p.fd, buf, 30, MSG_WAITALL));
        T("recv(30, MSG_WAITALL) at EOF = %s", r.c_str());
      },
      [](Pair& p) {
        write_all(p.fd, "0123456789", 10);
        sleep_ms(30);
        write_all(p.fd, "abcdefghij", 10);
        sleep_ms(30);
        write_all(p.fd, "ABCDEFGHIJ", 10);
        p.ctl.sync();
        write_all(p.fd, "tail!", 5);
        shutdown(p.fd, SHUT_WR);
      });
}

namespace {

// Writes to a connection whose peer closed, until EPIPE (or the bound).
void write_to_closed(Pair& p, bool nosignal) {
  install_counter(SIGPIPE, true);
  sig_count(SIGPIPE) = 0;
  p.ctl.sync();  // the client closed its socket
  char buf[1000];
  memset(buf, 'x', sizeof buf);
  bool epipe = false;
  uint64_t end = now_ms() + kBoundMs;
  while (now_ms() < end) {
    ssize_t n = nosignal ? send(p.fd, buf, sizeof buf, MSG_NOSIGNAL) : write(p.fd, buf, sizeof buf);
    if (n < 0 && errno == EPIPE) {
      epipe = true;
      break;
    }
    if (n < 0 && errno != ECONNRESET && errno != EINTR) {
      T("unexpected error %s", ename(errno));
      break;
    }
    if (n < 0) continue;
    sleep_ms(1);
  }
  T("got EPIPE eventually: %s", yes(epipe).c_str());
  T("SIGPIPE delivered: %s", yes(sig_count(SIGPIPE) > 0).c_str());
  auto r = E(nosignal ? send(p.fd, buf, 1, MSG_NOSIGNAL) : write(p.fd, buf, 1));
  T("next write = %s", r.c_str());
}

}  // namespace

SCENARIO(msg_nosignal_epipe, 2) {
  run_pair([](Pair& p) { write_to_closed(p, true); },
           [](Pair& p) {
             close(p.fd);
             p.ctl.sync();
           });
}

SCENARIO(sigpipe_default, 2) {
  run_pair([](Pair& p) { write_to_closed(p, false); },
           [](Pair& p) {
             close(p.fd);
             p.ctl.sync();
           });
}

SCENARIO(so_rcvtimeo, 2) {
  run_pair(
      [](Pair& p) {
        timeval tv{0, 200000};
        auto r = E(setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
        T("setsockopt(SO_RCVTIMEO, 200 ms) = %s", r.c_str());
        timeval back{};
        socklen_t len = sizeof back;
        getsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &back, &len);
        T("getsockopt(SO_RCVTIMEO) = %ld.%06ld", static_cast<long>(back.tv_sec), static_cast<long>(back.tv_usec));
        char buf[16];
        uint64_t t0 = now_ms();
        r = E(recv(p.fd, buf, sizeof buf, 0));
        T("recv on empty = %s; waited >= 150 ms: %s", r.c_str(), yes(now_ms() - t0 >= 150).c_str());
        t0 = now_ms();
        r = E(read(p.fd, buf, sizeof buf));
        T("read on empty = %s; waited >= 150 ms: %s", r.c_str(), yes(now_ms() - t0 >= 150).c_str());
        p.ctl.sync();  // the client writes 5 bytes
        ssize_t n = recv(p.fd, buf, sizeof buf, 0);
        T("recv with data = %s", Rn(n, buf).c_str());
      },
      [](Pair& p) {
        p.ctl.sync();
        write_all(p.fd, "data!", 5);
      });
}

SCENARIO(so_sndtimeo, 2) {
  run_pair(
      [](Pair& p) {
        timeval tv{0, 200000};
        auto r = E(setsockopt(p.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
        T("setsockopt(SO_SNDTIMEO, 200 ms) = %s", r.c_str());
        int err = 0;
        uint64_t t0 = now_ms();
        uint64_t n = fill_until_error(p.fd, 43, 65536, 0, &err);
        T("blocking send until error: ended with %s; accepted > 0: %s; took >= 150 ms: %s",
          err ? ename(err) : "cap reached", yes(n > 0).c_str(), yes(now_ms() - t0 >= 150).c_str());
        p.ctl.put(n);
        p.ctl.sync();
        r = E(send(p.fd, "end", 3, 0));
        T("send after the drain = %s", r.c_str());
      },
      [](Pair& p) {
        drain_accepted(p, 43);
        p.ctl.sync();
        char b[3];
        read_exact(p.fd, b, 3);
        T("got %s", quote(b, 3).c_str());
      });
}

SCENARIO(so_rcvlowat, 2) {
  run_pair(
      [](Pair& p) {
        int lowat = 10;
        auto r = E(setsockopt(p.fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat));
        T("setsockopt(SO_RCVLOWAT, 10) = %s", r.c_str());
        p.ctl.sync();  // the client wrote 5 bytes
        pollfd pf{p.fd, POLLIN, 0};
        int k = poll(&pf, 1, 200);
        T("poll(POLLIN, 200 ms) with 5 of 10 bytes = %s", pres(k, pf).c_str());
        p.ctl.sync();  // the client writes 5 more
        T("poll after 10 bytes: %s", pollev(poll_until(p.fd, POLLIN, POLLIN)).c_str());
        char buf[64];
        ssize_t n = recv(p.fd, buf, sizeof buf, 0);
        T("recv = %s", Rn(n, buf).c_str());
      },
      [](Pair& p) {
        write_all(p.fd, "12345", 5);
        p.ctl.sync();
        p.ctl.sync();
        write_all(p.fd, "67890", 5);
      });
}

SCENARIO(sockopt_basics, 2) {
  run_pair(
      [](Pair& p) {
        auto opt = [&](int fd, int level, int name, const char* what) {
          int v = -1;
          socklen_t len = sizeof v;
          auto r = E(getsockopt(fd, level, name, &v, &len));
          T("getsockopt(%s) = %s, value %d", what, r.c_str(), v);
        };
        opt(p.fd, SOL_SOCKET, SO_ERROR, "SO_ERROR");
        opt(p.fd, SOL_SOCKET, SO_TYPE, "SO_TYPE");
        opt(p.fd, SOL_SOCKET, SO_DOMAIN, "SO_DOMAIN");
        opt(p.fd, SOL_SOCKET, SO_PROTOCOL, "SO_PROTOCOL");
        opt(p.fd, SOL_SOCKET, SO_ACCEPTCONN, "SO_ACCEPTCONN");
        opt(p.lfd, SOL_SOCKET, SO_ACCEPTCONN, "SO_ACCEPTCONN of the listener");
        opt(p.fd, SOL_SOCKET, SO_RCVLOWAT, "SO_RCVLOWAT");
        int one = 1;
        auto r = E(setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one));
        T("setsockopt(TCP_NODELAY, 1) = %s", r.c_str());
        opt(p.fd, IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY");
        r = E(setsockopt(p.fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one));
        T("setsockopt(SO_KEEPALIVE, 1) = %s", r.c_str());
        opt(p.fd, SOL_SOCKET, SO_KEEPALIVE, "SO_KEEPALIVE");
        tcp_info ti{};
        socklen_t len = sizeof ti;
        r = E(getsockopt(p.fd, IPPROTO_TCP, TCP_INFO, &ti, &len));
        T("TCP_INFO = %s, state established: %s", r.c_str(), yes(ti.tcpi_state == TCP_ESTABLISHED).c_str());
        struct stat st{};
        fstat(p.fd, &st);
        T("fstat: S_ISSOCK %s", yes(S_ISSOCK(st.st_mode)).c_str());
        sockaddr_in self{}, peer{};
        len = sizeof self;
        getsockname(p.fd, reinterpret_cast<sockaddr*>(&self), &len);
        len = sizeof peer;
        getpeername(p.fd, reinterpret_cast<sockaddr*>(&peer), &len);
        uint64_t cself = p.ctl.get(), cpeer = p.ctl.get();
        T("my port == client's peer port: %s; my peer port == client's port: %s",
          yes(ntohs(self.sin_port) == cpeer).c_str(), yes(ntohs(peer.sin_port) == cself).c_str());
        T("my port == listener port: %s; peer address loopback: %s", yes(ntohs(self.sin_port) == p.port).c_str(),
          yes(peer.sin_addr.s_addr == htonl(INADDR_LOOPBACK)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        sockaddr_in self{}, peer{};
        socklen_t len = sizeof self;
        getsockname(p.fd, reinterpret_cast<sockaddr*>(&self), &len);
        len = sizeof peer;
        getpeername(p.fd, reinterpret_cast<sockaddr*>(&peer), &len);
        p.ctl.put(ntohs(self.sin_port));
        p.ctl.put(ntohs(peer.sin_port));
        int v = -1;
        len = sizeof v;
        getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &v, &len);
        T("SO_ERROR value %d", v);
        p.ctl.sync();  // stay connected until the server is done
      });
}

SCENARIO(fionread_siocinq, 2) {
  run_pair(
      [](Pair& p) {
        int n = -1;
        auto r = E(ioctl(p.fd, FIONREAD, &n));
        T("FIONREAD on empty = %s, value %d", r.c_str(), n);
        p.ctl.sync();
        p.ctl.sync();  // the client wrote 123 bytes
        poll_until(p.fd, POLLIN, POLLIN);
        r = E(ioctl(p.fd, FIONREAD, &n));
        T("FIONREAD after the peer wrote 123 = %s, value %d", r.c_str(), n);
        r = E(ioctl(p.fd, SIOCINQ, &n));
        T("SIOCINQ = %s, value %d", r.c_str(), n);
        char buf[200];
        read_exact(p.fd, buf, 23);
        ioctl(p.fd, FIONREAD, &n);
        T("FIONREAD after reading 23 = %d", n);
        read_exact(p.fd, buf, 100);
        ioctl(p.fd, FIONREAD, &n);
        T("FIONREAD after reading all = %d", n);
      },
      [](Pair& p) {
        char buf[123];
        fill_pattern(1, 0, buf, sizeof buf);
        p.ctl.sync();
        write_all(p.fd, buf, sizeof buf);
        p.ctl.sync();
      });
}

// FIONREAD before the first byte, on a fresh connection (no warm-up): the
// client's Hello waits in the server's socket, then the server's Ack (64
// bytes) in the client's; the kernel counts them, a program must not (wrk
// read and counted an error). Then the first data, counted and read.
SCENARIO(fionread_fresh, 2) {
  PairOpts cold;
  cold.warm = false;
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client connected (under rdmashim its Hello is here)
        usleep(50 * 1000);
        int n = -1;
        auto r = E(ioctl(p.fd, FIONREAD, &n));
        T("server FIONREAD before any data = %s, value %d", r.c_str(), n);
        char buf[16];
        T("server recv(MSG_DONTWAIT) = %s", E(recv(p.fd, buf, sizeof buf, MSG_DONTWAIT)).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client looked
        write_all(p.fd, "hello", 5);
        p.ctl.sync();
      },
      [](Pair& p) {
        p.ctl.sync();
        p.ctl.sync();  // the server has read (and under rdmashim answered the Hello)
        usleep(100 * 1000);
        int n = -1;
        auto r = E(ioctl(p.fd, FIONREAD, &n));
        T("FIONREAD before any data = %s, value %d", r.c_str(), n);
        p.ctl.sync();
        p.ctl.sync();  // the server wrote 5 bytes
        poll_until(p.fd, POLLIN, POLLIN);
        uint64_t end = now_ms() + kBoundMs;
        while (ioctl(p.fd, FIONREAD, &n) == 0 && n < 5 && now_ms() < end) usleep(1000);
        T("FIONREAD once readable = %d", n);
        char buf[16];
        T("read = %s", Rn(read(p.fd, buf, sizeof buf), buf).c_str());
      },
      cold);
}

SCENARIO(siocoutq, 2) {
  run_pair(
      [](Pair& p) {
        int n = -1;
        auto r = E(ioctl(p.fd, SIOCOUTQ, &n));
        T("SIOCOUTQ idle = %s, value >= 0: %s", r.c_str(), yes(n >= 0).c_str());
        char buf[1000];
        fill_pattern(2, 0, buf, sizeof buf);
        write_all(p.fd, buf, sizeof buf);
        r = E(ioctl(p.fd, SIOCOUTQ, &n));
        T("SIOCOUTQ after writing 1000 = %s, value >= 0: %s", r.c_str(), yes(n >= 0).c_str());
        p.ctl.sync();  // the client read the 1000 bytes
        uint64_t end = now_ms() + kBoundMs;
        do {
          ioctl(p.fd, SIOCOUTQ, &n);
        } while (n != 0 && now_ms() < end && (sleep_ms(5), true));
        T("SIOCOUTQ reaches 0 after the peer read everything: %s", yes(n == 0).c_str());
        set_nonblock(p.fd, true);
        int err = 0;
        std::vector<uint8_t> big(16384, 'z');
        uint64_t total = 0;
        while (total < (512ull << 20)) {
          ssize_t k = write(p.fd, big.data(), big.size());
          if (k < 0) {
            err = errno;
            break;
          }
          total += static_cast<uint64_t>(k);
        }
        ioctl(p.fd, SIOCOUTQ, &n);
        T("filled until %s: SIOCOUTQ > 0: %s", ename(err), yes(n > 0).c_str());
        p.ctl.put(total);
        p.ctl.sync();
        end = now_ms() + kBoundMs;
        do {
          ioctl(p.fd, SIOCOUTQ, &n);
        } while (n != 0 && now_ms() < end && (sleep_ms(5), true));
        T("SIOCOUTQ reaches 0 after the peer drained: %s", yes(n == 0).c_str());
      },
      [](Pair& p) {
        char buf[1000];
        read_exact(p.fd, buf, sizeof buf);
        T("read 1000, pattern ok: %s", yes(fnv(kFnvInit, buf, 1000) == pattern_sum(2, 1000)).c_str());
        p.ctl.sync();
        uint64_t n = p.ctl.get();
        std::vector<char> b(65536);
        for (uint64_t got = 0; got < n;) {
          size_t k = static_cast<size_t>(std::min<uint64_t>(b.size(), n - got));
          read_exact(p.fd, b.data(), k);
          got += k;
        }
        p.ctl.sync();
      });
}
