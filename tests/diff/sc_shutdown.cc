// Shutdown and close: half-close semantics, data still in flight at close,
// and resets (SO_LINGER {1,0}, close with unread data).
#include "sc_common.h"

using namespace diff;

namespace {

// Waits (bounded) until FIONREAD says at least n bytes are there.
bool wait_bytes(int fd, int n) {
  uint64_t end = now_ms() + kBoundMs;
  int have = 0;
  while (now_ms() < end) {
    if (ioctl(fd, FIONREAD, &have) == 0 && have >= n) return true;
    sleep_ms(2);
  }
  return false;
}

// Reads until EOF or an error; prints how many bytes and how it ended.
void drain_and_report(int fd, const char* who) {
  char buf[65536];
  uint64_t total = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      total += static_cast<uint64_t>(n);
      continue;
    }
    std::string r = E(n);
    T("%s: drained %llu bytes, then read = %s", who, static_cast<unsigned long long>(total), r.c_str());
    break;
  }
  T("%s: next read = %s", who, E(read(fd, buf, sizeof buf)).c_str());
}

}  // namespace

SCENARIO(shutdown_wr, 2) {
  run_pair(
      [](Pair& p) {
        char buf[16];
        read_exact(p.fd, buf, 10);
        T("got %s", quote(buf, 10).c_str());
        T("read at EOF = %s", E(read(p.fd, buf, sizeof buf)).c_str());
        T("read at EOF again = %s", E(read(p.fd, buf, sizeof buf)).c_str());
        pollfd pf{p.fd, POLLIN | POLLOUT | POLLRDHUP, 0};
        int k = poll(&pf, 1, 0);
        T("poll = %s", pres(k, pf).c_str());
        T("write back to the half-closed peer = %s", E(write(p.fd, "reply", 5)).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client checked its side
        close(p.fd);
        p.ctl.sync();
      },
      [](Pair& p) {
        write_all(p.fd, "last words", 10);
        T("shutdown(SHUT_WR) = %s", E(shutdown(p.fd, SHUT_WR)).c_str());
        p.ctl.sync();
        char buf[8];
        read_exact(p.fd, buf, 5);
        T("still reads: %s", quote(buf, 5).c_str());
        T("send after own SHUT_WR = %s", E(send(p.fd, "x", 1, MSG_NOSIGNAL)).c_str());
        pollfd pf{p.fd, POLLIN | POLLOUT, 0};
        int k = poll(&pf, 1, 0);
        T("poll(IN|OUT) after own SHUT_WR, nothing to read = %s", pres(k, pf).c_str());
        T("shutdown(SHUT_WR) again = %s", E(shutdown(p.fd, SHUT_WR)).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the server closed
        T("after the server closed: %s", pollev(poll_until(p.fd, POLLIN, POLLIN)).c_str());
        T("read = %s", E(read(p.fd, buf, sizeof buf)).c_str());
      });
}

SCENARIO(shutdown_rd, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client wrote 5 bytes
        wait_bytes(p.fd, 5);
        T("shutdown(SHUT_RD) = %s", E(shutdown(p.fd, SHUT_RD)).c_str());
        pollfd pf{p.fd, POLLIN | POLLRDHUP, 0};
        int k = poll(&pf, 1, 0);
        T("poll(IN|RDHUP) = %s", pres(k, pf).c_str());
        char buf[16];
        ssize_t n = read(p.fd, buf, sizeof buf);
        T("read (5 bytes were queued) = %s", Rn(n, buf).c_str());
        T("read again = %s", E(read(p.fd, buf, sizeof buf)).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client wrote 4 more
        T("the 4 late bytes are counted by FIONREAD: %s", yes(wait_bytes(p.fd, 4)).c_str());
        n = read(p.fd, buf, sizeof buf);
        T("read = %s", Rn(n, buf).c_str());
        T("write after SHUT_RD = %s", E(write(p.fd, "still", 5)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        write_all(p.fd, "early", 5);
        p.ctl.sync();
        p.ctl.sync();
        T("write after the server's SHUT_RD = %s", E(send(p.fd, "late", 4, MSG_NOSIGNAL)).c_str());
        p.ctl.sync();
        char buf[8];
        read_exact(p.fd, buf, 5);
        T("got %s", quote(buf, 5).c_str());
        p.ctl.sync();
      });
}

SCENARIO(shutdown_rdwr, 2) {
  run_pair(
      [](Pair& p) {
        T("shutdown(SHUT_RDWR) = %s", E(shutdown(p.fd, SHUT_RDWR)).c_str());
        char buf[8];
        T("read = %s", E(read(p.fd, buf, sizeof buf)).c_str());
        T("send = %s", E(send(p.fd, "x", 1, MSG_NOSIGNAL)).c_str());
        pollfd pf{p.fd, POLLIN | POLLOUT | POLLRDHUP, 0};
        int k = poll(&pf, 1, 0);
        T("poll = %s", pres(k, pf).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client saw EOF and wrote 1 byte
        T("the client's byte is counted by FIONREAD: %s", yes(wait_bytes(p.fd, 1)).c_str());
        T("read = %s", E(read(p.fd, buf, sizeof buf)).c_str());
        T("shutdown(SHUT_RDWR) again = %s", E(shutdown(p.fd, SHUT_RDWR)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        p.ctl.sync();
        char buf[8];
        T("read = %s", E(read(p.fd, buf, sizeof buf)).c_str());
        T("write to the shut-down peer = %s", E(send(p.fd, "y", 1, MSG_NOSIGNAL)).c_str());
        p.ctl.sync();
        p.ctl.sync();
      });
}

SCENARIO(shutdown_errors, 2) {
  run_pair(
      [](Pair& p) {
        T("shutdown(fd, 99) = %s", E(shutdown(p.fd, 99)).c_str());
        T("shutdown(fd, -1) = %s", E(shutdown(p.fd, -1)).c_str());
        int s = socket(AF_INET, SOCK_STREAM, 0);
        T("shutdown of an unconnected socket = %s", E(shutdown(s, SHUT_WR)).c_str());
        close(s);
        int pp[2];
        pipe(pp);
        T("shutdown of a pipe = %s", E(shutdown(pp[0], SHUT_RD)).c_str());
        T("shutdown of a closed fd = %s", E(shutdown(4000, SHUT_RD)).c_str());
        T("the connection still works: %s", E(write(p.fd, "fine", 4)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        char buf[4];
        read_exact(p.fd, buf, 4);
        T("got %s", quote(buf, 4).c_str());
        p.ctl.sync();
      });
}

SCENARIO(close_unsent_data, 2) {
  run_pair(
      [](Pair& p) {
        set_nonblock(p.fd, true);
        std::vector<char> buf(16384);
        uint64_t total = 0;
        const uint64_t cap = 4u << 20;
        while (total < cap) {
          size_t k = static_cast<size_t>(std::min<uint64_t>(buf.size(), cap - total));
          fill_pattern(19, total, buf.data(), k);
          ssize_t n = write(p.fd, buf.data(), k);
          if (n < 0) break;
          total += static_cast<uint64_t>(n);
        }
        p.ctl.put(total);
        T("close with unsent data = %s", E(close(p.fd)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        uint64_t n = p.ctl.get();
        uint64_t sum = 0;
        uint64_t got = read_to_eof(p.fd, &sum);
        T("read to EOF: got exactly what the server wrote before close: %s; pattern: %s", yes(got == n).c_str(),
          yes(sum == pattern_sum(19, n)).c_str());
        p.ctl.sync();
      });
}

SCENARIO(close_linger_graceful, 2) {
  run_pair(
      [](Pair& p) {
        linger lg{1, 5};
        T("SO_LINGER {1, 5} = %s", E(setsockopt(p.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg)).c_str());
        set_nonblock(p.fd, true);
        std::vector<char> buf(16384);
        uint64_t total = 0;
        while (total < (1u << 20)) {
          fill_pattern(20, total, buf.data(), buf.size());
          ssize_t n = write(p.fd, buf.data(), buf.size());
          if (n < 0) break;
          total += static_cast<uint64_t>(n);
        }
        set_nonblock(p.fd, false);
        p.ctl.put(total);
        T("close (lingering while the peer reads) = %s", E(close(p.fd)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        uint64_t n = p.ctl.get();
        uint64_t sum = 0;
        uint64_t got = read_to_eof(p.fd, &sum);
        T("read to EOF: got all: %s; pattern: %s", yes(got == n).c_str(), yes(sum == pattern_sum(20, n)).c_str());
        p.ctl.sync();
      });
}

SCENARIO(close_linger0_rst, 2) {
  run_pair(
      [](Pair& p) {
        write_all(p.fd, "bye", 3);
        linger lg{1, 0};
        T("SO_LINGER {1, 0} = %s", E(setsockopt(p.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg)).c_str());
        p.ctl.sync();  // the client has the 3 bytes
        T("close = %s", E(close(p.fd)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        char buf[3];
        read_exact(p.fd, buf, 3);
        T("got %s", quote(buf, 3).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the server closed with linger 0
        T("poll: %s", pollev(poll_until(p.fd, POLLIN, POLLERR | POLLHUP)).c_str());
        drain_and_report(p.fd, "after the reset");
        T("send = %s", E(send(p.fd, "x", 1, MSG_NOSIGNAL)).c_str());
      });
}

SCENARIO(close_unread_rst, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client wrote 1000 bytes we never read
        wait_bytes(p.fd, 1000);
        write_all(p.fd, "unread", 6);
        p.ctl.sync();  // the client has our 6 bytes queued (not read)
        T("close with 1000 unread bytes = %s", E(close(p.fd)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        std::vector<char> b(1000, 'u');
        write_all(p.fd, b.data(), b.size());
        p.ctl.sync();
        wait_bytes(p.fd, 6);
        p.ctl.sync();
        p.ctl.sync();  // the server closed
        T("poll: %s", pollev(poll_until(p.fd, POLLIN, POLLERR | POLLHUP)).c_str());
        drain_and_report(p.fd, "after the server's close");
      });
}
