// Data: every call that moves bytes, including the ones that bypass the
// usual read/write family (sendmmsg, recvmmsg, sendfile, splice), odd
// arguments (zero lengths, bad pointers, MSG_TRUNC, MSG_OOB) and bulk.
#include <limits.h>
#include <stdlib.h>
#include <sys/sendfile.h>

#include "sc_common.h"

using namespace diff;

namespace {

// Not constants, so the compiler does not warn about what the kernel must reject.
volatile int g_minus_one = -1;
volatile uintptr_t g_bad_address = 16;

// Exact counts of reads below are deterministic because each message is
// small, written in one call, and fully arrived (poll + barrier) before the
// read.
void wait_bytes(int fd, int n) {
  uint64_t end = now_ms() + kBoundMs;
  int have = 0;
  while (now_ms() < end) {
    if (ioctl(fd, FIONREAD, &have) == 0 && have >= n) return;
    poll_until(fd, POLLIN, POLLIN, 50);
  }
}

}  // namespace

SCENARIO(io_read_write, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client wrote 1000 bytes in one write
        poll_until(p.fd, POLLIN, POLLIN);
        std::vector<char> buf(4096);
        ssize_t n = read(p.fd, buf.data(), 100);
        uint64_t h = fnv(kFnvInit, buf.data(), n > 0 ? static_cast<size_t>(n) : 0);
        T("read(100) = %s", E(n).c_str());
        n = read(p.fd, buf.data(), 4096);
        T("read(4096) = %s", E(n).c_str());
        h = fnv(h, buf.data(), n > 0 ? static_cast<size_t>(n) : 0);
        T("the 1000 bytes are the pattern: %s", yes(h == pattern_sum(11, 1000)).c_str());
        std::vector<char> out(5000);
        fill_pattern(12, 0, out.data(), out.size());
        auto r = E(write(p.fd, out.data(), out.size()));
        T("write(5000) = %s", r.c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        std::vector<char> b(1000);
        fill_pattern(11, 0, b.data(), b.size());
        auto r = E(write(p.fd, b.data(), b.size()));
        T("write(1000) = %s", r.c_str());
        p.ctl.sync();
        std::vector<char> in(5000);
        read_exact(p.fd, in.data(), in.size());
        T("read 5000, pattern: %s", yes(fnv(kFnvInit, in.data(), 5000) == pattern_sum(12, 5000)).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_readv_writev, 2) {
  run_pair(
      [](Pair& p) {
        char a[] = "abc", c[] = "defgh";
        iovec w[3] = {{a, 3}, {nullptr, 0}, {c, 5}};
        auto r = E(writev(p.fd, w, 3));
        T("writev([3, 0, 5]) = %s", r.c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client read the 8 bytes
        std::vector<char> ones(IOV_MAX);
        std::vector<iovec> many(IOV_MAX);
        for (int i = 0; i < IOV_MAX; ++i) {
          ones[i] = static_cast<char>('A' + i % 26);
          many[i] = {&ones[i], 1};
        }
        r = E(writev(p.fd, many.data(), IOV_MAX));
        T("writev(IOV_MAX x 1 byte) = %s", r.c_str());
        many.push_back({&ones[0], 1});
        r = E(writev(p.fd, many.data(), IOV_MAX + 1));
        T("writev(IOV_MAX + 1) = %s", r.c_str());
        r = E(writev(p.fd, many.data(), g_minus_one));
        T("writev(-1 iovecs) = %s", r.c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        p.ctl.sync();
        wait_bytes(p.fd, 8);
        char x[2], y[1], z[3], w[10];
        iovec r4[4] = {{x, 2}, {y, 0}, {z, 3}, {w, 10}};
        ssize_t n = readv(p.fd, r4, 4);
        T("readv([2, 0, 3, 10]) = %s: %s %s %s", E(n).c_str(), quote(x, 2).c_str(), quote(z, 3).c_str(),
          quote(w, n > 5 ? n - 5 : 0).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the server wrote IOV_MAX bytes
        wait_bytes(p.fd, IOV_MAX);
        std::vector<char> in(IOV_MAX);
        iovec halves[2] = {{in.data(), IOV_MAX / 2}, {in.data() + IOV_MAX / 2, IOV_MAX / 2}};
        n = readv(p.fd, halves, 2);
        bool ok = n == IOV_MAX;
        for (int i = 0; ok && i < IOV_MAX; ++i) ok = in[i] == static_cast<char>('A' + i % 26);
        T("readv of the IOV_MAX bytes = %s, content ok: %s", E(n).c_str(), yes(ok).c_str());
        auto r = E(readv(p.fd, halves, g_minus_one));
        T("readv(-1 iovecs) = %s", r.c_str());
        std::vector<iovec> too_many(IOV_MAX + 1, iovec{in.data(), 1});
        r = E(readv(p.fd, too_many.data(), IOV_MAX + 1));
        T("readv(IOV_MAX + 1) = %s", r.c_str());
      });
}

SCENARIO(io_recv_send_variants, 2) {
  run_pair(
      [](Pair& p) {
        sockaddr_in peer{};
        socklen_t plen = sizeof peer;
        getpeername(p.fd, reinterpret_cast<sockaddr*>(&peer), &plen);
        auto r = E(send(p.fd, "send", 4, 0));
        T("send = %s", r.c_str());
        r = E(sendto(p.fd, "sendto-null", 11, 0, nullptr, 0));
        T("sendto(no address) = %s", r.c_str());
        r = E(sendto(p.fd, "sendto-peer", 11, 0, reinterpret_cast<sockaddr*>(&peer), plen));
        T("sendto(the peer's address) = %s", r.c_str());
        sockaddr_in other{};
        other.sin_family = AF_INET;
        other.sin_port = htons(9);
        other.sin_addr.s_addr = htonl(0x0A000001);
        r = E(sendto(p.fd, "sendto-other", 12, 0, reinterpret_cast<sockaddr*>(&other), sizeof other));
        T("sendto(another address) = %s", r.c_str());
        char data[] = "sendmsg";
        iovec iov{data, 7};
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        r = E(sendmsg(p.fd, &m, 0));
        T("sendmsg = %s", r.c_str());
        m.msg_name = &peer;
        m.msg_namelen = plen;
        r = E(sendmsg(p.fd, &m, 0));
        T("sendmsg(with the peer's name) = %s", r.c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client read everything
      },
      [](Pair& p) {
        p.ctl.sync();
        wait_bytes(p.fd, 4 + 11 + 11 + 12 + 7 + 7);
        char buf[64];
        ssize_t n = recv(p.fd, buf, 4, 0);
        T("recv(4) = %s", Rn(n, buf).c_str());
        sockaddr_storage from{};
        socklen_t flen = sizeof from;
        n = recvfrom(p.fd, buf, 11, 0, reinterpret_cast<sockaddr*>(&from), &flen);
        T("recvfrom(11, with address buffer) = %s; addrlen %u", Rn(n, buf).c_str(), flen);
        n = recvfrom(p.fd, buf, 11, 0, nullptr, nullptr);
        T("recvfrom(11, no address) = %s", Rn(n, buf).c_str());
        char ctl[64];
        iovec iov{buf, 12};
        msghdr m{};
        m.msg_name = &from;
        m.msg_namelen = sizeof from;
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        m.msg_flags = 0x7fff;
        n = recvmsg(p.fd, &m, 0);
        T("recvmsg(12) = %s; namelen %u, controllen %zu, flags 0x%x", Rn(n, buf).c_str(),
          m.msg_namelen, static_cast<size_t>(m.msg_controllen), m.msg_flags);
        n = recv(p.fd, buf, sizeof buf, 0);
        T("recv(rest) = %s", Rn(n, buf).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_many_iovecs, 2) {
  run_pair(
      [](Pair& p) {
        // 100 iovecs of sizes 1..100 (5050 bytes), then IOV_MAX of 3 bytes.
        std::vector<char> data(5050 + 3 * IOV_MAX);
        fill_pattern(13, 0, data.data(), data.size());
        std::vector<iovec> v;
        size_t off = 0;
        for (size_t i = 1; i <= 100; ++i) {
          v.push_back({data.data() + off, i});
          off += i;
        }
        msghdr m{};
        m.msg_iov = v.data();
        m.msg_iovlen = v.size();
        auto r = E(sendmsg(p.fd, &m, 0));
        T("sendmsg(100 iovecs, 5050 bytes) = %s", r.c_str());
        std::vector<iovec> w;
        for (int i = 0; i < IOV_MAX; ++i) {
          w.push_back({data.data() + off, 3});
          off += 3;
        }
        m.msg_iov = w.data();
        m.msg_iovlen = w.size();
        r = E(sendmsg(p.fd, &m, 0));
        T("sendmsg(IOV_MAX iovecs) = %s", r.c_str());
        w.push_back({data.data(), 1});
        m.msg_iovlen = w.size();
        r = E(sendmsg(p.fd, &m, 0));
        T("sendmsg(IOV_MAX + 1 iovecs) = %s", r.c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        std::vector<char> in(5050 + 3 * IOV_MAX);
        // Receive with the sizes reversed: 100..1, then IOV_MAX x 3, all with MSG_WAITALL.
        std::vector<iovec> v;
        size_t off = 0;
        for (size_t i = 100; i >= 1; --i) {
          v.push_back({in.data() + off, i});
          off += i;
        }
        msghdr m{};
        m.msg_iov = v.data();
        m.msg_iovlen = v.size();
        ssize_t n = recvmsg(p.fd, &m, MSG_WAITALL);
        T("recvmsg(100 iovecs, MSG_WAITALL) = %s", E(n).c_str());
        std::vector<iovec> w;
        for (int i = 0; i < IOV_MAX; ++i) {
          w.push_back({in.data() + off, 3});
          off += 3;
        }
        m.msg_iov = w.data();
        m.msg_iovlen = w.size();
        n = recvmsg(p.fd, &m, MSG_WAITALL);
        T("recvmsg(IOV_MAX iovecs, MSG_WAITALL) = %s", E(n).c_str());
        T("all bytes in order: %s", yes(fnv(kFnvInit, in.data(), in.size()) == pattern_sum(13, in.size())).c_str());
        w.push_back({in.data(), 1});
        m.msg_iovlen = w.size();
        auto r = E(recvmsg(p.fd, &m, MSG_DONTWAIT));
        T("recvmsg(IOV_MAX + 1 iovecs) = %s", r.c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_sendmmsg_recvmmsg, 2) {
  run_pair(
      [](Pair& p) {
        const char* parts[3][2] = {{"m0-a", "m0-bb"}, {"m1-ccc", "m1-d"}, {"m2-e", "m2-ffffff"}};
        iovec iov[3][2];
        mmsghdr mm[3] = {};
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 2; ++j) iov[i][j] = {const_cast<char*>(parts[i][j]), strlen(parts[i][j])};
          mm[i].msg_hdr.msg_iov = iov[i];
          mm[i].msg_hdr.msg_iovlen = 2;
        }
        int k = sendmmsg(p.fd, mm, 3, 0);
        T("sendmmsg(3 messages) = %s; msg_len %u %u %u", E(k).c_str(), mm[0].msg_len, mm[1].msg_len, mm[2].msg_len);
        p.ctl.sync();
        p.ctl.sync();  // the client sent 2 x 6 bytes with sendmmsg
        wait_bytes(p.fd, 12);
        char a[6], b[6];
        iovec ia{a, 6}, ib{b, 6};
        mmsghdr in[2] = {};
        in[0].msg_hdr.msg_iov = &ia;
        in[0].msg_hdr.msg_iovlen = 1;
        in[1].msg_hdr.msg_iov = &ib;
        in[1].msg_hdr.msg_iovlen = 1;
        k = recvmmsg(p.fd, in, 2, MSG_DONTWAIT, nullptr);
        T("recvmmsg(2 x 6, MSG_DONTWAIT) = %s; %s %s", E(k).c_str(), quote(a, in[0].msg_len).c_str(),
          quote(b, in[1].msg_len).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        p.ctl.sync();
        wait_bytes(p.fd, 32);
        char bufs[3][16] = {};
        size_t lens[3] = {9, 10, 13};
        iovec iov[3];
        mmsghdr mm[3] = {};
        for (int i = 0; i < 3; ++i) {
          iov[i] = {bufs[i], lens[i]};
          mm[i].msg_hdr.msg_iov = &iov[i];
          mm[i].msg_hdr.msg_iovlen = 1;
        }
        int k = recvmmsg(p.fd, mm, 3, MSG_WAITALL, nullptr);
        T("recvmmsg(9, 10, 13; MSG_WAITALL) = %s", E(k).c_str());
        for (int i = 0; i < (k > 0 ? k : 0); ++i) {
          T("  message %d: %u %s", i, mm[i].msg_len, quote(bufs[i], mm[i].msg_len).c_str());
        }
        char x[] = "first!", y[] = "second";
        iovec ix{x, 6}, iy{y, 6};
        mmsghdr out[2] = {};
        out[0].msg_hdr.msg_iov = &ix;
        out[0].msg_hdr.msg_iovlen = 1;
        out[1].msg_hdr.msg_iov = &iy;
        out[1].msg_hdr.msg_iovlen = 1;
        k = sendmmsg(p.fd, out, 2, 0);
        T("sendmmsg(2 x 6) = %s", E(k).c_str());
        p.ctl.sync();
        p.ctl.sync();
      });
}

SCENARIO(io_sendfile, 2) {
  run_pair(
      [](Pair& p) {
        char path[] = "/tmp/diff_sendfile_XXXXXX";
        int f = mkstemp(path);
        unlink(path);
        const size_t size = 300000;
        std::vector<char> data(size);
        fill_pattern(14, 0, data.data(), size);
        write(f, data.data(), size);
        off_t off = 0;
        uint64_t sent = 0;
        bool error = false;
        while (sent < size) {
          ssize_t n = sendfile(p.fd, f, &off, size - sent);
          if (n <= 0) {
            T("sendfile = %s after %llu", E(n).c_str(), static_cast<unsigned long long>(sent));
            error = true;
            break;
          }
          sent += static_cast<uint64_t>(n);
        }
        T("sendfile(with offset) sent %llu; offset now %lld", static_cast<unsigned long long>(sent),
          static_cast<long long>(off));
        lseek(f, 0, SEEK_SET);
        ssize_t n = sendfile(p.fd, f, nullptr, 1000);
        T("sendfile(no offset, 1000) = %s; file position now %lld%s", E(n).c_str(),
          static_cast<long long>(lseek(f, 0, SEEK_CUR)), error ? " (after an error)" : "");
        p.ctl.sync();
      },
      [](Pair& p) {
        uint64_t h = recv_stream(p.fd, 14, 300000);
        T("received 300000, pattern: %s", yes(h == pattern_sum(14, 300000)).c_str());
        h = recv_stream(p.fd, 14, 1000);
        T("received 1000 more, pattern: %s", yes(h == pattern_sum(14, 1000)).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_splice_sock_to_pipe, 2) {
  run_pair(
      [](Pair& p) {
        int pp[2];
        pipe(pp);
        const uint64_t size = 200000;
        uint64_t got = 0, h = kFnvInit;
        std::vector<char> buf(65536);
        uint64_t end = now_ms() + 2 * kBoundMs;
        while (got < size && now_ms() < end) {
          ssize_t n = splice(p.fd, nullptr, pp[1], nullptr, 65536, SPLICE_F_MOVE);
          if (n <= 0) {
            T("splice(socket -> pipe) = %s after %llu", E(n).c_str(), static_cast<unsigned long long>(got));
            break;
          }
          for (ssize_t left = n; left > 0;) {
            ssize_t k = read(pp[0], buf.data(), static_cast<size_t>(left));
            if (k <= 0) break;
            h = fnv(h, buf.data(), static_cast<size_t>(k));
            left -= k;
          }
          got += static_cast<uint64_t>(n);
        }
        T("spliced %llu bytes from the socket, pattern: %s", static_cast<unsigned long long>(got),
          yes(got == size && h == pattern_sum(15, size)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        uint64_t h = send_stream(p.fd, 15, 200000);
        T("sent 200000: %s", yes(h == pattern_sum(15, 200000)).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_splice_pipe_to_sock, 2) {
  run_pair(
      [](Pair& p) {
        int pp[2];
        pipe(pp);
        const uint64_t size = 200000;
        std::vector<char> buf(16384);
        uint64_t sent = 0;
        while (sent < size) {
          size_t k = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - sent));
          fill_pattern(16, sent, buf.data(), k);
          write(pp[1], buf.data(), k);
          size_t left = k;
          while (left > 0) {
            ssize_t n = splice(pp[0], nullptr, p.fd, nullptr, left, SPLICE_F_MOVE);
            if (n <= 0) {
              T("splice(pipe -> socket) = %s", E(n).c_str());
              p.ctl.sync();
              return;
            }
            left -= static_cast<size_t>(n);
          }
          sent += k;
        }
        T("spliced %llu bytes into the socket", static_cast<unsigned long long>(sent));
        p.ctl.sync();
      },
      [](Pair& p) {
        uint64_t h = recv_stream(p.fd, 16, 200000);
        T("received 200000, pattern: %s", yes(h == pattern_sum(16, 200000)).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_zero_length, 2) {
  run_pair(
      [](Pair& p) {
        char buf[8];
        // Each line is written before its call: a call that blocks shows here.
        // (The kernel: read/readv of 0 bytes return 0 at once; recv/recvmsg
        // of 0 bytes wait like any recv, so they run with a receive timeout.)
        T("read(0) on empty ...");
        T("  = %s", E(read(p.fd, buf, 0)).c_str());
        T("read(NULL, 0) ...");
        T("  = %s", E(read(p.fd, nullptr, 0)).c_str());
        T("readv(0 iovecs) ...");
        T("  = %s", E(readv(p.fd, nullptr, 0)).c_str());
        T("recv(0, MSG_DONTWAIT) on empty ...");
        T("  = %s", E(recv(p.fd, buf, 0, MSG_DONTWAIT)).c_str());
        timeval tv{0, 200000};
        setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        T("recv(0) on empty, SO_RCVTIMEO 200 ms ...");
        uint64_t t0 = now_ms();
        auto r = E(recv(p.fd, buf, 0, 0));
        T("  = %s; waited >= 150 ms: %s", r.c_str(), yes(now_ms() - t0 >= 150).c_str());
        iovec none{buf, 0};
        msghdr mr{};
        mr.msg_iov = &none;
        mr.msg_iovlen = 1;
        T("recvmsg(one empty iovec) on empty, SO_RCVTIMEO 200 ms ...");
        t0 = now_ms();
        r = E(recvmsg(p.fd, &mr, 0));
        T("  = %s; waited >= 150 ms: %s", r.c_str(), yes(now_ms() - t0 >= 150).c_str());
        tv = {0, 0};
        setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        T("write(0) = %s", E(write(p.fd, buf, 0)).c_str());
        T("send(0) = %s", E(send(p.fd, buf, 0, 0)).c_str());
        T("writev(0 iovecs) = %s", E(writev(p.fd, nullptr, 0)).c_str());
        iovec empty{buf, 0};
        msghdr m{};
        m.msg_iov = &empty;
        m.msg_iovlen = 1;
        T("sendmsg(one empty iovec) = %s", E(sendmsg(p.fd, &m, 0)).c_str());
        T("write(1) = %s", E(write(p.fd, "!", 1)).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client wrote 3 bytes
        wait_bytes(p.fd, 3);
        T("with data waiting: read(0) = %s", E(read(p.fd, buf, 0)).c_str());
        T("with data waiting: recv(0) = %s", E(recv(p.fd, buf, 0, 0)).c_str());
        int n = -1;
        ioctl(p.fd, FIONREAD, &n);
        T("FIONREAD still %d", n);
        ssize_t k = read(p.fd, buf, sizeof buf);
        T("read = %s", Rn(k, buf).c_str());
      },
      [](Pair& p) {
        p.ctl.sync();
        char buf[8];
        ssize_t k = read(p.fd, buf, sizeof buf);
        T("read = %s %s (only the one real byte)", E(k).c_str(), quote(buf, k > 0 ? k : 0).c_str());
        T("then recv(MSG_DONTWAIT) = %s", E(recv(p.fd, buf, sizeof buf, MSG_DONTWAIT)).c_str());
        write_all(p.fd, "xyz", 3);
        p.ctl.sync();
      });
}

SCENARIO(io_efault, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client wrote 10 bytes
        wait_bytes(p.fd, 10);
        void* bad = reinterpret_cast<void*>(g_bad_address);
        T("recv into a bad pointer ...");
        T("  = %s", E(recv(p.fd, bad, 10, 0)).c_str());
        T("read into a bad pointer ...");
        T("  = %s", E(read(p.fd, bad, 10)).c_str());
        char buf[16];
        ssize_t n = read(p.fd, buf, sizeof buf);
        T("then read = %s", Rn(n, buf).c_str());
        T("send from a bad pointer ...");
        T("  = %s", E(send(p.fd, bad, 10, MSG_NOSIGNAL)).c_str());
        T("write from a bad pointer ...");
        T("  = %s", E(write(p.fd, bad, 10)).c_str());
        write_all(p.fd, "ok", 2);
        p.ctl.sync();
      },
      [](Pair& p) {
        write_all(p.fd, "0123456789", 10);
        p.ctl.sync();
        char buf[2];
        read_exact(p.fd, buf, 2);
        T("got %s (nothing from the failed sends before it)", quote(buf, 2).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_msg_trunc, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.sync();
        wait_bytes(p.fd, 10);
        T("recv(NULL, 4, MSG_TRUNC) = %s", E(recv(p.fd, nullptr, 4, MSG_TRUNC)).c_str());
        char buf[16];
        ssize_t n = recv(p.fd, buf, sizeof buf, 0);
        T("then recv = %s", Rn(n, buf).c_str());
      },
      [](Pair& p) {
        write_all(p.fd, "0123456789", 10);
        p.ctl.sync();
      });
}

SCENARIO(io_msg_oob, 2) {
  run_pair(
      [](Pair& p) {
        char buf[16];
        T("recv(MSG_OOB) with no urgent data = %s", E(recv(p.fd, buf, 1, MSG_OOB | MSG_DONTWAIT)).c_str());
        p.ctl.sync();
        p.ctl.sync();  // the client sent "ab" then "!" with MSG_OOB
        short ev = poll_until(p.fd, POLLIN | POLLPRI, POLLPRI);
        T("poll(IN|PRI): %s", pollev(ev).c_str());
        T("sockatmark = %d", sockatmark(p.fd));
        ssize_t n = recv(p.fd, buf, 1, MSG_OOB);
        std::string r = E(n);
        T("recv(MSG_OOB) = %s %s", r.c_str(), quote(buf, n > 0 ? n : 0).c_str());
        n = recv(p.fd, buf, sizeof buf, 0);
        T("recv = %s", Rn(n, buf).c_str());
        T("sockatmark = %d", sockatmark(p.fd));
      },
      [](Pair& p) {
        p.ctl.sync();
        write_all(p.fd, "ab", 2);
        T("send(\"!\", MSG_OOB) = %s", E(send(p.fd, "!", 1, MSG_OOB)).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_bulk_ragged, 2) {
  run_pair(
      [](Pair& p) {
        uint64_t h = recv_stream(p.fd, 17, 8u << 20);
        T("received 8 MiB, pattern: %s", yes(h == pattern_sum(17, 8u << 20)).c_str());
        h = send_stream(p.fd, 18, 8u << 20);
        T("sent 8 MiB");
        // Many tiny writes.
        for (int i = 0; i < 5000; ++i) {
          char c = static_cast<char>(i);
          write_all(p.fd, &c, 1);
        }
        T("sent 5000 one-byte writes");
        p.ctl.sync();
      },
      [](Pair& p) {
        send_stream(p.fd, 17, 8u << 20);
        T("sent 8 MiB");
        uint64_t h = recv_stream(p.fd, 18, 8u << 20);
        T("received 8 MiB, pattern: %s", yes(h == pattern_sum(18, 8u << 20)).c_str());
        std::vector<char> b(5000);
        read_exact(p.fd, b.data(), b.size());
        bool ok = true;
        for (int i = 0; i < 5000; ++i) ok = ok && b[i] == static_cast<char>(i);
        T("received the 5000 single bytes in order: %s", yes(ok).c_str());
        p.ctl.sync();
      });
}

SCENARIO(io_cork_more, 2) {
  run_pair(
      [](Pair& p) {
        T("send(\"ab\", MSG_MORE) = %s", E(send(p.fd, "ab", 2, MSG_MORE)).c_str());
        T("send(\"cd\") = %s", E(send(p.fd, "cd", 2, 0)).c_str());
        int one = 1, zero = 0;
        T("TCP_CORK 1 = %s", E(setsockopt(p.fd, IPPROTO_TCP, TCP_CORK, &one, sizeof one)).c_str());
        T("write(\"ef\") = %s", E(write(p.fd, "ef", 2)).c_str());
        T("TCP_CORK 0 = %s", E(setsockopt(p.fd, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero)).c_str());
        p.ctl.sync();
      },
      [](Pair& p) {
        char buf[6];
        read_exact(p.fd, buf, 6);
        T("got %s", quote(buf, 6).c_str());
        p.ctl.sync();
      });
}
