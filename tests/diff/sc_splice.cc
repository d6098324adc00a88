// splice() and sendfile() at the edges: full pipes (blocking or not, with
// and without SPLICE_F_NONBLOCK), a pipe with one free slot, full socket
// buffers (rings), errors. Every byte must arrive exactly once, in order:
// nothing may leave one side that the other did not take.
#include <sys/sendfile.h>

#include "sc_common.h"

using namespace diff;

namespace {

// Fills a pipe until the kernel refuses more (without blocking); returns the count.
size_t fill_pipe(int fd) {
  bool nb = is_nonblock(fd);
  set_nonblock(fd, true);
  std::vector<char> junk(65536, 'x');
  size_t total = 0;
  for (;;) {
    ssize_t n = write(fd, junk.data(), junk.size());
    if (n <= 0) break;
    total += static_cast<size_t>(n);
  }
  set_nonblock(fd, nb);
  return total;
}

// Reads exactly n bytes of a pipe (they are there); returns their checksum.
uint64_t take(int fd, size_t n, uint64_t h = kFnvInit) {
  std::vector<char> b(65536);
  while (n > 0) {
    ssize_t r = read(fd, b.data(), std::min(n, b.size()));
    if (r <= 0) fatal("take: %s", E(r).c_str());
    h = fnv(h, b.data(), static_cast<size_t>(r));
    n -= static_cast<size_t>(r);
  }
  return h;
}

// Fills the socket's send path (socket buffer, or ring) until it refuses;
// returns the count (never printed: it depends on buffer sizes).
uint64_t fill_socket(int fd) {
  bool nb = is_nonblock(fd);
  set_nonblock(fd, true);
  std::vector<char> junk(65536, 'y');
  uint64_t total = 0;
  int small = 16384;  // a locked buffer does not grow while we fill it
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  for (int quiet = 0; quiet < 10;) {
    ssize_t n = send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    if (n > 0) {
      total += static_cast<uint64_t>(n);
      quiet = 0;
    } else {
      ++quiet;
      sleep_ms(20);  // let in-flight bytes settle, then try again
    }
  }
  set_nonblock(fd, nb);
  return total;
}

// The peer's side, before fill_socket: a small, locked receive buffer.
void small_rcvbuf(int fd) {
  int small = 16384;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
}

// The peer's side of fill_socket: skips `junk` bytes, then checks n pattern bytes.
void skip_then_check(int fd, uint64_t junk, uint64_t seed, uint64_t n, const char* what) {
  std::vector<char> b(65536);
  while (junk > 0) {
    ssize_t r = read(fd, b.data(), std::min<uint64_t>(junk, b.size()));
    if (r <= 0) fatal("skip: %s", E(r).c_str());
    junk -= static_cast<uint64_t>(r);
  }
  uint64_t h = recv_stream(fd, seed, n);
  T("%s: all bytes exactly once, in order: %s", what, yes(h == pattern_sum(seed, n)).c_str());
}

// Waits until the socket is readable (the client's bytes have landed).
void wait_bytes_or_ring(int fd) {
  poll_until(fd, POLLIN, POLLIN);
  sleep_ms(50);  // and the rest of its single write
}

int pipe_bytes(int fd) {
  int n = -1;
  ioctl(fd, FIONREAD, &n);
  return n;
}

constexpr uint64_t kMsg = 10000;

}  // namespace

SCENARIO(splice_sock_to_full_pipe, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client's 10000 bytes are on their way
        wait_bytes_or_ring(p.fd);
        int pp[2];
        pipe(pp);
        size_t junk = fill_pipe(pp[1]);
        set_nonblock(pp[1], true);
        T("full non-blocking pipe, flags 0: %s", E(splice(p.fd, nullptr, pp[1], nullptr, 4096, 0)).c_str());
        T("full non-blocking pipe, SPLICE_F_NONBLOCK: %s",
          E(splice(p.fd, nullptr, pp[1], nullptr, 4096, SPLICE_F_NONBLOCK)).c_str());
        set_nonblock(pp[1], false);
        T("full blocking pipe, SPLICE_F_NONBLOCK ...");
        T("  = %s", E(splice(p.fd, nullptr, pp[1], nullptr, 4096, SPLICE_F_NONBLOCK | SPLICE_F_MOVE)).c_str());
        // Blocking pipe, non-blocking socket, no flag: the kernel waits for
        // room in the pipe first. A thread makes room after a while.
        set_nonblock(p.fd, true);
        pthread_t drainer;
        struct Arg {
          int fd;
          size_t n;
        } arg{pp[0], junk};
        pthread_create(
            &drainer, nullptr,
            [](void* a) -> void* {
              auto* x = static_cast<Arg*>(a);
              sleep_ms(200);
              take(x->fd, x->n);
              return nullptr;
            },
            &arg);
        T("full blocking pipe, non-blocking socket, flags 0 (waits for room) ...");
        ssize_t n = splice(p.fd, nullptr, pp[1], nullptr, kMsg, 0);
        T("  > 0: %s", yes(n > 0).c_str());
        pthread_join(drainer, nullptr);
        uint64_t got = n > 0 ? static_cast<uint64_t>(n) : 0;
        uint64_t h = take(pp[0], got);
        while (got < kMsg) {
          ssize_t k = splice(p.fd, nullptr, pp[1], nullptr, kMsg - got, SPLICE_F_NONBLOCK);
          if (k <= 0) fatal("splice: %s", E(k).c_str());
          h = take(pp[0], static_cast<size_t>(k), h);
          got += static_cast<uint64_t>(k);
        }
        T("10000 bytes through the pipe exactly once, in order: %s", yes(h == pattern_sum(21, kMsg)).c_str());
        T("empty non-blocking socket, pipe with room: %s",
          E(splice(p.fd, nullptr, pp[1], nullptr, 4096, SPLICE_F_NONBLOCK)).c_str());
        // SPLICE_F_NONBLOCK does not reach the socket: a blocking socket waits (here its timeout).
        set_nonblock(p.fd, false);
        timeval tv{0, 200000};
        setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        T("empty blocking socket (SO_RCVTIMEO), SPLICE_F_NONBLOCK: %s",
          E(splice(p.fd, nullptr, pp[1], nullptr, 4096, SPLICE_F_NONBLOCK)).c_str());
        // A pipe nobody reads: EPIPE before the socket is even looked at.
        signal(SIGPIPE, SIG_IGN);
        close(pp[0]);
        T("pipe without readers: %s", E(splice(p.fd, nullptr, pp[1], nullptr, 4096, SPLICE_F_NONBLOCK)).c_str());
        close(pp[1]);
        p.ctl.sync();
      },
      [](Pair& p) {
        std::vector<char> b(kMsg);
        fill_pattern(21, 0, b.data(), b.size());
        write_all(p.fd, b.data(), b.size());
        p.ctl.sync();
        p.ctl.sync();
      });
}

SCENARIO(splice_sock_to_pipe_one_slot, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();
        wait_bytes_or_ring(p.fd);
        int pp[2];
        pipe2(pp, O_NONBLOCK);
        T("F_SETPIPE_SZ 8192: %s", E(fcntl(pp[1], F_SETPIPE_SZ, 8192)).c_str());
        // Two slots in use, the second with room for a write() but none for splice.
        std::vector<char> junk(4096 + 100, 'z');
        T("write 4196: %s", E(write(pp[1], junk.data(), junk.size())).c_str());
        T("splice into the pipe with two slots used: %s",
          E(splice(p.fd, nullptr, pp[1], nullptr, kMsg, SPLICE_F_NONBLOCK)).c_str());
        take(pp[0], 4096);  // one slot free
        ssize_t n = splice(p.fd, nullptr, pp[1], nullptr, kMsg, SPLICE_F_NONBLOCK);
        T("splice with one free slot: > 0 and <= 4096: %s", yes(n > 0 && n <= 4096).c_str());
        T("pipe holds the 100 old bytes and the spliced ones: %s", yes(pipe_bytes(pp[0]) == 100 + n).c_str());
        take(pp[0], 100);
        uint64_t got = n > 0 ? static_cast<uint64_t>(n) : 0;
        uint64_t h = take(pp[0], got);
        while (got < kMsg) {
          ssize_t k = splice(p.fd, nullptr, pp[1], nullptr, kMsg - got, SPLICE_F_NONBLOCK);
          if (k <= 0) fatal("splice: %s", E(k).c_str());
          h = take(pp[0], static_cast<size_t>(k), h);
          got += static_cast<uint64_t>(k);
        }
        T("10000 bytes exactly once, in order: %s", yes(h == pattern_sum(22, kMsg)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        std::vector<char> b(kMsg);
        fill_pattern(22, 0, b.data(), b.size());
        write_all(p.fd, b.data(), b.size());
        p.ctl.sync();
        p.ctl.sync();
      });
}

SCENARIO(splice_pipe_to_full_sock, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();
        uint64_t junk = fill_socket(p.fd);
        p.ctl.put(junk);
        int pp[2];
        pipe(pp);
        std::vector<char> b(5000);
        fill_pattern(23, 0, b.data(), b.size());
        write(pp[1], b.data(), b.size());
        set_nonblock(p.fd, true);
        T("full non-blocking socket, SPLICE_F_NONBLOCK: %s",
          E(splice(pp[0], nullptr, p.fd, nullptr, 5000, SPLICE_F_NONBLOCK)).c_str());
        T("full non-blocking socket, flags 0: %s", E(splice(pp[0], nullptr, p.fd, nullptr, 5000, 0)).c_str());
        T("the pipe still holds 5000: %s", yes(pipe_bytes(pp[0]) == 5000).c_str());
        int empty[2];
        pipe(empty);
        set_nonblock(p.fd, false);
        T("empty blocking pipe, SPLICE_F_NONBLOCK: %s",
          E(splice(empty[0], nullptr, p.fd, nullptr, 100, SPLICE_F_NONBLOCK)).c_str());
        close(empty[1]);
        T("empty pipe without writers: %s", E(splice(empty[0], nullptr, p.fd, nullptr, 100, 0)).c_str());
        close(empty[0]);
        p.ctl.sync();  // the client drains now
        uint64_t sent = 0;
        while (sent < 5000) {
          ssize_t n = splice(pp[0], nullptr, p.fd, nullptr, 5000 - sent, SPLICE_F_NONBLOCK);
          if (n <= 0) fatal("splice: %s", E(n).c_str());
          sent += static_cast<uint64_t>(n);
        }
        T("spliced the 5000 once the peer read: pipe now holds %d", pipe_bytes(pp[0]));
        p.ctl.sync();
      },
      [](Pair& p) {
        small_rcvbuf(p.fd);
        p.ctl.sync();
        uint64_t junk = p.ctl.get();
        p.ctl.sync();
        skip_then_check(p.fd, junk, 23, 5000, "after the junk, 5000 from the pipe");
        p.ctl.sync();
      });
}

SCENARIO(sendfile_full_sock, 2) {
  run_pair(
      [](Pair& p) {
        char path[] = "/tmp/diff_sendfile_full_XXXXXX";
        int f = mkstemp(path);
        unlink(path);
        const size_t size = 100000;
        std::vector<char> data(size);
        fill_pattern(24, 0, data.data(), size);
        write(f, data.data(), size);
        lseek(f, 500, SEEK_SET);
        p.ctl.sync();
        uint64_t junk = fill_socket(p.fd);
        p.ctl.put(junk);
        set_nonblock(p.fd, true);
        off_t off = 0;
        std::string r = E(sendfile(p.fd, f, &off, size));
        T("full non-blocking socket, with offset: %s; offset %lld", r.c_str(), static_cast<long long>(off));
        r = E(sendfile(p.fd, f, nullptr, size));
        T("full non-blocking socket, no offset: %s; position %lld", r.c_str(),
          static_cast<long long>(lseek(f, 0, SEEK_CUR)));
        p.ctl.sync();  // the client drains now
        uint64_t sent = 0;
        bool exact = true;
        while (sent < size) {
          ssize_t n = sendfile(p.fd, f, &off, size - sent);
          if (n < 0 && errno == EAGAIN) {
            poll_until(p.fd, POLLOUT, POLLOUT);
            continue;
          }
          if (n <= 0) fatal("sendfile: %s", E(n).c_str());
          sent += static_cast<uint64_t>(n);
          exact = exact && static_cast<uint64_t>(off) == sent;
        }
        T("with offset: the offset always equals the bytes sent: %s; now %lld", yes(exact).c_str(),
          static_cast<long long>(off));
        T("the file position did not move: %lld", static_cast<long long>(lseek(f, 0, SEEK_CUR)));
        sent = 0;
        exact = true;
        while (sent < 1000) {
          ssize_t n = sendfile(p.fd, f, nullptr, 1000 - sent);
          if (n < 0 && errno == EAGAIN) {
            poll_until(p.fd, POLLOUT, POLLOUT);
            continue;
          }
          if (n <= 0) fatal("sendfile: %s", E(n).c_str());
          sent += static_cast<uint64_t>(n);
          exact = exact && lseek(f, 0, SEEK_CUR) == static_cast<off_t>(500 + sent);
        }
        T("no offset: the position always moved by the bytes sent: %s; now %lld", yes(exact).c_str(),
          static_cast<long long>(lseek(f, 0, SEEK_CUR)));
        p.ctl.sync();
      },
      [](Pair& p) {
        small_rcvbuf(p.fd);
        p.ctl.sync();
        uint64_t junk = p.ctl.get();
        p.ctl.sync();
        skip_then_check(p.fd, junk, 24, 100000, "after the junk, the file");
        std::vector<char> b(1000), want(1000);
        read_exact(p.fd, b.data(), b.size());
        fill_pattern(24, 500, want.data(), want.size());
        T("then bytes 500..1500 of the file: %s", yes(b == want).c_str());
        p.ctl.sync();
      });
}

SCENARIO(splice_errors, 2) {
  run_pair(
      [](Pair& p) {
        int pp[2];
        pipe(pp);
        loff_t off = 0;
        char path[] = "/tmp/diff_splice_err_XXXXXX";
        int f = mkstemp(path);
        unlink(path);
        T("len 0, bad flags: %s", E(splice(p.fd, nullptr, pp[1], nullptr, 0, 0x100)).c_str());
        T("bad flags: %s", E(splice(p.fd, nullptr, pp[1], nullptr, 10, 0x100)).c_str());
        T("offset on the socket: %s", E(splice(p.fd, &off, pp[1], nullptr, 10, SPLICE_F_NONBLOCK)).c_str());
        T("offset on the pipe: %s", E(splice(p.fd, nullptr, pp[1], &off, 10, SPLICE_F_NONBLOCK)).c_str());
        T("into the pipe's read end: %s", E(splice(p.fd, nullptr, pp[0], nullptr, 10, SPLICE_F_NONBLOCK)).c_str());
        T("from the pipe's write end: %s", E(splice(pp[1], nullptr, p.fd, nullptr, 10, SPLICE_F_NONBLOCK)).c_str());
        T("socket to itself: %s", E(splice(p.fd, nullptr, p.fd, nullptr, 10, SPLICE_F_NONBLOCK)).c_str());
        T("socket to a file: %s", E(splice(p.fd, nullptr, f, nullptr, 10, SPLICE_F_NONBLOCK)).c_str());
        T("pipe to socket, offset on the socket: %s",
          E(splice(pp[0], nullptr, p.fd, &off, 10, SPLICE_F_NONBLOCK)).c_str());
        T("pipe to socket, offset on the pipe: %s",
          E(splice(pp[0], &off, p.fd, nullptr, 10, SPLICE_F_NONBLOCK)).c_str());
        T("bad descriptor: %s", E(splice(p.fd, nullptr, 999, nullptr, 10, 0)).c_str());
        off_t o = 0;
        T("sendfile from a pipe: %s", E(sendfile(p.fd, pp[0], nullptr, 10)).c_str());
        T("sendfile from the socket into a file: %s", E(sendfile(f, p.fd, nullptr, 10)).c_str());
        T("sendfile from the socket, with offset: %s", E(sendfile(pp[1], p.fd, &o, 10)).c_str());
        o = -1;
        T("sendfile, negative offset: %s", E(sendfile(p.fd, f, &o, 10)).c_str());
        T("sendfile, 0 bytes: %s", E(sendfile(p.fd, f, nullptr, 0)).c_str());
        T("tee on the socket: %s", E(tee(p.fd, pp[1], 10, SPLICE_F_NONBLOCK)).c_str());
        T("copy_file_range from the socket: %s", E(copy_file_range(p.fd, nullptr, f, nullptr, 10, 0)).c_str());
        // sendfile from the socket into a pipe is a splice.
        p.ctl.sync();
        poll_until(p.fd, POLLIN, POLLIN);
        set_nonblock(pp[1], true);
        ssize_t n = sendfile(pp[1], p.fd, nullptr, 100);
        char b[16] = {};
        if (n > 0) read(pp[0], b, sizeof b);
        T("sendfile from the socket into a pipe: %s", Rn(n, b).c_str());
        set_nonblock(p.fd, true);
        T("again, nothing there, non-blocking socket: %s", E(sendfile(pp[1], p.fd, nullptr, 100)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        p.ctl.sync();
        write_all(p.fd, "hello", 5);
        p.ctl.sync();
      });
}
