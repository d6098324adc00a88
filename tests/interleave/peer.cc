// interleave_peer: one end of one seed's connection (see README.md). Plain
// socket calls only; the harness runs it with or without the preload.
//
//   interleave_peer --seed S --role server --port-fd N   (listens, writes its port to fd N)
//   interleave_peer --seed S --role client --port P
//
// Everything it does (I/O model, call families, split sizes, delays, where it
// shuts down and closes) follows from the seed's plan (plan.h) and a PRNG
// seeded by seed and role. Every received byte is compared with the
// expected stream; readiness that a read or write then contradicts (POLLIN
// and EAGAIN) is an error too. Exit 0: all as planned; 1: a failure,
// described on stderr.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <mutex>

#include "plan.h"

using namespace interleave;

namespace {

const char* g_role = "?";
uint64_t g_seed = 0;
std::atomic<const char*> g_phase{"start"};
std::atomic<uint64_t> g_rx{0}, g_tx{0};

[[noreturn]] void fail(const char* fmt, ...) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "interleave_peer %s seed %llu: FAIL: ", g_role,
                   static_cast<unsigned long long>(g_seed));
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  va_end(ap);
  if (n > static_cast<int>(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  (void)!write(2, buf, n);
  _exit(1);
}

void on_alarm(int) {
  char buf[256];
  int n = snprintf(buf, sizeof buf, "interleave_peer %s seed %llu: FAIL: hang in %s (rx %llu, tx %llu)\n",
                   g_role, static_cast<unsigned long long>(g_seed), g_phase.load(),
                   static_cast<unsigned long long>(g_rx.load()), static_cast<unsigned long long>(g_tx.load()));
  (void)!write(2, buf, n);
  _exit(1);
}

void sleep_us(uint32_t us) {
  if (!us) return;
  timespec ts{us / 1000000, static_cast<long>(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

// The program's own choices per call (call family, split size): one PRNG
// for the receiving side and one for the rest, so that the blocking model's
// two threads each draw their own sequence.
struct Choices {
  Rng rng{0};
  uint64_t pick(uint64_t n) { return rng.below(n); }
} g_choice, g_rx_choice;

class Conn {
 public:
  Conn(int fd, const Side& me, bool is_client, uint64_t seed)
      : fd_(fd), me_(me), tx_key_(stream_key(seed, is_client)), rx_key_(stream_key(seed, !is_client)) {
    tx_buf_ = static_cast<unsigned char*>(malloc(1 << 20));
    rx_buf_ = static_cast<unsigned char*>(malloc(1 << 20));
    exp_buf_ = static_cast<unsigned char*>(malloc(1 << 20));
  }

  // Wants: reading (more bytes due, or the EOF), writing (a chunk whose gate opened).
  bool want_in() const { return rx_ < me_.rx_total || (me_.read_eof && !eof_); }
  bool want_out() const {
    return chunk_ < me_.writes.size() && rx_.load() >= me_.writes[chunk_].gate;
  }
  bool tx_done() const { return chunk_ >= me_.writes.size(); }

  // One read call. Returns its result (bytes, 0 at EOF) or -errno for EAGAIN/EINTR.
  ssize_t read_once() {
    size_t want = 1 + g_rx_choice.pick(me_.max_read);
    ssize_t n;
    switch (g_rx_choice.pick(5)) {
      case 0: n = read(fd_, rx_buf_, want); break;
      case 1: n = recv(fd_, rx_buf_, want, 0); break;
      case 2: {
        size_t a = want / 2;
        iovec v[2] = {{rx_buf_, a}, {rx_buf_ + a, want - a}};
        n = readv(fd_, v, 2);
        break;
      }
      case 3: {
        iovec v{rx_buf_, want};
        msghdr m{};
        m.msg_iov = &v;
        m.msg_iovlen = 1;
        n = recvmsg(fd_, &m, 0);
        break;
      }
      default: n = recvfrom(fd_, rx_buf_, want, 0, nullptr, nullptr); break;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return -errno;
      fail("read error after %llu of %llu bytes: %s", ull(rx_), ull(me_.rx_total), strerror(errno));
    }
    if (n == 0) {
      if (rx_ < me_.rx_total) fail("early EOF after %llu of %llu bytes", ull(rx_), ull(me_.rx_total));
      eof_ = true;
      return 0;
    }
    check(static_cast<size_t>(n));
    if (me_.stall_us && !stalled_) {  // the writer fills the ring meanwhile (elastic laps grow)
      stalled_ = true;
      sleep_us(me_.stall_us);
    }
    return n;
  }

  // One write call (of the current chunk, from the gate on).
  ssize_t write_once() {
    const Chunk& c = me_.writes[chunk_];
    uint64_t left = c.len - chunk_done_;
    size_t n = 1 + g_choice.pick(me_.max_write);
    if (n > left) n = static_cast<size_t>(left);
    if (n > (1 << 20)) n = 1 << 20;
    stream_fill(tx_key_, tx_, tx_buf_, n);
    ssize_t r;
    switch (g_choice.pick(5)) {
      case 0: r = write(fd_, tx_buf_, n); break;
      case 1: r = send(fd_, tx_buf_, n, MSG_NOSIGNAL); break;
      case 2: {
        size_t a = n / 3, b = n / 3;
        iovec v[3] = {{tx_buf_, a}, {tx_buf_ + a, b}, {tx_buf_ + a + b, n - a - b}};
        r = writev(fd_, v, 3);
        break;
      }
      case 3: {
        iovec v{tx_buf_, n};
        msghdr m{};
        m.msg_iov = &v;
        m.msg_iovlen = 1;
        r = sendmsg(fd_, &m, MSG_NOSIGNAL);
        break;
      }
      default: r = sendto(fd_, tx_buf_, n, MSG_NOSIGNAL, nullptr, 0); break;
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return -errno;
      fail("write error after %llu of %llu bytes (received %llu of %llu): %s", ull(tx_), ull(me_.tx_total),
           ull(rx_), ull(me_.rx_total), strerror(errno));
    }
    if (r == 0) fail("write returned 0 for %zu bytes", n);
    tx_ += static_cast<uint64_t>(r);
    g_tx = tx_;
    chunk_done_ += static_cast<uint64_t>(r);
    if (chunk_done_ == c.len) {
      ++chunk_;
      chunk_done_ = 0;
      if (tx_done() && me_.shut_wr) {
        g_phase = "shutdown";
        if (shutdown(fd_, SHUT_WR) != 0) fail("shutdown(SHUT_WR): %s", strerror(errno));
      }
    }
    return r;
  }

  void check(size_t n) {
    uint64_t at = rx_;
    if (at + n > me_.rx_total) {
      size_t extra = static_cast<size_t>(at + n - me_.rx_total);
      const unsigned char* e = rx_buf_ + (n - extra);
      fail("%zu byte(s) beyond the %llu expected (first: %02x %02x %02x %02x)", extra, ull(me_.rx_total), e[0],
           extra > 1 ? e[1] : 0, extra > 2 ? e[2] : 0, extra > 3 ? e[3] : 0);
    }
    stream_fill(rx_key_, at, exp_buf_, n);
    if (memcmp(exp_buf_, rx_buf_, n) != 0) {
      size_t i = 0;
      while (rx_buf_[i] == exp_buf_[i]) ++i;
      const unsigned char* g = rx_buf_ + i;
      size_t k = n - i;
      fail("byte %llu of %llu differs: got %02x %02x %02x %02x, expected %02x", ull(at + i), ull(me_.rx_total),
           g[0], k > 1 ? g[1] : 0, k > 2 ? g[2] : 0, k > 3 ? g[3] : 0, exp_buf_[i]);
    }
    rx_ += n;
    g_rx = rx_.load();
  }

  static unsigned long long ull(uint64_t v) { return v; }

  int fd_;
  const Side& me_;
  uint64_t tx_key_, rx_key_;
  unsigned char *tx_buf_, *rx_buf_, *exp_buf_;
  std::atomic<uint64_t> rx_{0};
  uint64_t tx_ = 0, chunk_done_ = 0;
  size_t chunk_ = 0;
  bool eof_ = false;
  bool stalled_ = false;
};

// Blocking: a reader thread, and the writer here waiting for each gate.
std::mutex g_mu;
std::condition_variable g_cv;

void* reader(void* arg) {
  auto* c = static_cast<Conn*>(arg);
  while (c->want_in()) {
    ssize_t n = c->read_once();
    if (n == -EAGAIN || n == -EWOULDBLOCK) fail("EAGAIN from a blocking read");
    std::lock_guard<std::mutex> l(g_mu);
    g_cv.notify_all();
  }
  return nullptr;
}

void run_blocking(Conn& c) {
  pthread_t t;
  if (pthread_create(&t, nullptr, reader, &c) != 0) fail("pthread_create");
  while (!c.tx_done()) {
    {
      std::unique_lock<std::mutex> l(g_mu);
      g_cv.wait(l, [&] { return c.want_out(); });
    }
    ssize_t n = c.write_once();
    if (n == -EAGAIN || n == -EWOULDBLOCK) fail("EAGAIN from a blocking write");
  }
  pthread_join(t, nullptr);
}

void set_nonblocking(int fd) {
  if (g_choice.pick(2)) {
    int on = 1;
    if (ioctl(fd, FIONBIO, &on) != 0) fail("FIONBIO: %s", strerror(errno));
  } else {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) fail("F_SETFL: %s", strerror(errno));
  }
}

// poll, epoll (level or edge triggered) and bare non-blocking calls.
void run_nonblocking(Conn& c, Io io) {
  int ep = -1;
  uint32_t registered = 0;
  if (io == Io::kEpollLt || io == Io::kEpollEt) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) fail("epoll_create1: %s", strerror(errno));
    if (io == Io::kEpollEt) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      ev.data.fd = c.fd_;
      if (epoll_ctl(ep, EPOLL_CTL_ADD, c.fd_, &ev) != 0) fail("epoll_ctl: %s", strerror(errno));
    }
  }
  // Edge triggered: wait only once both wanted directions met EAGAIN.
  bool in_blocked = false, out_blocked = false;
  int idle_ms = 0;
  while (c.want_in() || c.want_out()) {
    bool wi = c.want_in(), wo = c.want_out();
    bool rd = false, wr = false;  // what the wait reported
    if (io == Io::kNonblock) {
      rd = wi;
      wr = wo;
    } else if (io == Io::kEpollEt && !((!wi || in_blocked) && (!wo || out_blocked))) {
      rd = wi && !in_blocked;
      wr = wo && !out_blocked;
    } else {
      short want = static_cast<short>((wi ? POLLIN : 0) | (wo ? POLLOUT : 0));
      int n;
      short got = 0;
      if (io == Io::kPoll) {
        pollfd p{c.fd_, want, 0};
        n = poll(&p, 1, 1000);
        got = p.revents;
      } else {
        if (io == Io::kEpollLt) {
          uint32_t ev_want = (wi ? uint32_t{EPOLLIN} : 0u) | (wo ? uint32_t{EPOLLOUT} : 0u);
          if (ev_want != registered) {
            epoll_event ev{};
            ev.events = ev_want;
            ev.data.fd = c.fd_;
            if (epoll_ctl(ep, registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd_, &ev) != 0) {
              fail("epoll_ctl: %s", strerror(errno));
            }
            registered = ev_want;
          }
        }
        epoll_event ev{};
        n = epoll_wait(ep, &ev, 1, 1000);
        if (n > 0) {
          got = static_cast<short>(((ev.events & EPOLLIN) ? POLLIN : 0) | ((ev.events & EPOLLOUT) ? POLLOUT : 0) |
                                   ((ev.events & EPOLLERR) ? POLLERR : 0) | ((ev.events & EPOLLHUP) ? POLLHUP : 0));
        }
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("%s: %s", io_name(io), strerror(errno));
      }
      if (n == 0) {
        // Nothing in a plan waits a second: under --downgrades (INTERLEAVE_STRICT_IDLE)
        // a wait that long is a lost wakeup, even if a timeout would recover it.
        if (getenv("INTERLEAVE_STRICT_IDLE")) {
          // What each layer says now tells a lost edge (the kernel and our
          // poll see bytes, the wait did not report them) from bytes that
          // never came.
          pollfd ours{c.fd_, POLLIN, 0};
          int ours_n = poll(&ours, 1, 0);
          pollfd kernel{c.fd_, POLLIN, 0};
          timespec zero{0, 0};
          long kernel_n = syscall(SYS_ppoll, &kernel, 1, &zero, nullptr, 8);
          int queued = -1;
          syscall(SYS_ioctl, c.fd_, FIONREAD, &queued);
          fail("no readiness for 1 s (%s, want %d) after %llu bytes in; now our poll %d (%#x), the kernel's %ld (%#x), "
               "%d bytes queued in the kernel",
               io_name(io), want, Conn::ull(c.rx_), ours_n, ours.revents, kernel_n, kernel.revents, queued);
        }
        if ((idle_ms += 1000) >= 8000) fail("no readiness for 8 s (%s, want %d)", io_name(io), want);
        continue;
      }
      idle_ms = 0;
      bool err = got & (POLLERR | POLLHUP);
      if (io == Io::kEpollEt) {
        if (got & (POLLIN | POLLERR | POLLHUP)) in_blocked = false;
        if (got & (POLLOUT | POLLERR | POLLHUP)) out_blocked = false;
        rd = wi && !in_blocked;
        wr = wo && !out_blocked;
      } else {
        rd = wi && ((got & POLLIN) || err);
        wr = wo && ((got & POLLOUT) || err);
        if (!rd && !wr) fail("%s reported %#x, nothing asked for (want %#x)", io_name(io), got, want);
      }
    }
    bool level = io == Io::kPoll || io == Io::kEpollLt;
    bool progress = false;
    if (rd) {
      g_phase = "read";
      // Edge triggered: read until EAGAIN; otherwise one call per report.
      for (;;) {
        ssize_t n = c.read_once();
        if (n == -EINTR) continue;
        if (n == -EAGAIN || n == -EWOULDBLOCK) {
          if (level) fail("%s reported POLLIN, then read found EAGAIN (received %llu of %llu)", io_name(io),
                          Conn::ull(c.rx_), Conn::ull(c.me_.rx_total));
          in_blocked = true;
          break;
        }
        progress = true;
        if (io != Io::kEpollEt || !c.want_in()) break;
      }
    }
    if (wr && c.want_out()) {
      g_phase = "write";
      for (;;) {
        ssize_t n = c.write_once();
        if (n == -EINTR) continue;
        if (n == -EAGAIN || n == -EWOULDBLOCK) {
          if (level) fail("%s reported POLLOUT, then write found EAGAIN (sent %llu of %llu)", io_name(io),
                          Conn::ull(c.tx_), Conn::ull(c.me_.tx_total));
          out_blocked = true;
          break;
        }
        progress = true;
        if (io != Io::kEpollEt || !c.want_out()) break;
      }
    }
    if (io == Io::kNonblock && !progress) {
      if (g_choice.pick(2)) sched_yield();
      else sleep_us(static_cast<uint32_t>(g_choice.pick(100)));
    }
  }
  if (ep >= 0) close(ep);
}

int connect_client(int port, const Side& me) {
  bool nb = me.io != Io::kBlocking;
  bool nb_connect = nb && me.nb_connect;
  int fd = socket(AF_INET, SOCK_STREAM | (nb_connect ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) fail("socket: %s", strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (!nb_connect || errno != EINPROGRESS) fail("connect: %s", strerror(errno));
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 5000) != 1) fail("non-blocking connect did not complete");
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) fail("connect: %s", strerror(err));
  }
  if (nb && !nb_connect) set_nonblocking(fd);
  return fd;
}

int serve(int port_fd, const Side& me) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 4) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    fail("listen: %s", strerror(errno));
  }
  char buf[32];
  int n = snprintf(buf, sizeof buf, "%d\n", ntohs(a.sin_port));
  if (write(port_fd, buf, n) != n) fail("writing the port: %s", strerror(errno));
  close(port_fd);
  sleep_us(me.start_delay_us);
  g_phase = "accept";
  bool nb = me.io != Io::kBlocking;
  int fd = nb && g_choice.pick(2) ? accept4(l, nullptr, nullptr, SOCK_NONBLOCK) : accept(l, nullptr, nullptr);
  if (fd < 0) fail("accept: %s", strerror(errno));
  close(l);
  if (nb && !(fcntl(fd, F_GETFL) & O_NONBLOCK)) set_nonblocking(fd);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  bool client = false, have_seed = false;
  int port = -1, port_fd = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seed")) g_seed = strtoull(argv[i + 1], nullptr, 10), have_seed = true;
    else if (!strcmp(argv[i], "--role")) client = !strcmp(argv[i + 1], "client");
    else if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--port-fd")) port_fd = atoi(argv[i + 1]);
  }
  if (!have_seed || (client ? port <= 0 : port_fd < 0)) {
    fprintf(stderr, "usage: interleave_peer --seed S --role client --port P | --role server --port-fd N\n");
    return 2;
  }
  g_role = client ? "client" : "server";
  signal(SIGALRM, on_alarm);
  signal(SIGPIPE, SIG_IGN);
  alarm(20);
  Plan plan = make_plan(g_seed);
  const Side& me = client ? plan.client : plan.server;
  g_choice.rng = Rng(g_seed ^ (client ? 0x11111111ull : 0x22222222ull));
  g_rx_choice.rng = Rng(g_seed ^ (client ? 0x33333333ull : 0x44444444ull));

  int fd;
  if (client) {
    sleep_us(me.start_delay_us);
    g_phase = "connect";
    fd = connect_client(port, me);
  } else {
    fd = serve(port_fd, me);
  }
  sleep_us(me.io_delay_us);
  Conn c(fd, me, client, g_seed);
  g_phase = "io";
  if (me.io == Io::kBlocking) run_blocking(c);
  else run_nonblocking(c, me.io);
  if (c.rx_ != me.rx_total || c.tx_ != me.tx_total) fail("ended with rx %llu/%llu tx %llu/%llu", Conn::ull(c.rx_),
                                                        Conn::ull(me.rx_total), Conn::ull(c.tx_), Conn::ull(me.tx_total));
  sleep_us(me.close_delay_us);
  g_phase = "close";
  if (close(fd) != 0) fail("close: %s", strerror(errno));
  return 0;
}
