// libdiff_ctor.so: a library whose constructor uses TCP sockets before
// main() runs, i.e. hooks called from another library's constructor (under
// LD_PRELOAD, a library the executable needs is initialised before the
// preloaded one). Active only when DIFF_CTOR_PORT is set (the init_ctor_hooks
// scenario); it connects to that port on 127.0.0.1 and goes through every
// hooked call, writing one line per call into a buffer that main() prints.
//
// Protocol with the scenario's server: a message is 1 length byte L (1..200)
// and L bytes, echoed back verbatim; L = 0 followed by a 2-byte port asks the
// server to connect to that port, send "reverse!", read 8 bytes back, close,
// and answer 'R'.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

namespace {

// Plain storage only: this runs before C++ static constructors are ordered.
char g_buf[16384];
size_t g_len;

void line(const char* fmt, ...) {
  int saved = errno;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(g_buf + g_len, sizeof g_buf - g_len - 1, fmt, ap);
  va_end(ap);
  if (n > 0) g_len += static_cast<size_t>(n) < sizeof g_buf - g_len - 2 ? static_cast<size_t>(n) : 0;
  g_buf[g_len++] = '\n';
  g_buf[g_len] = '\0';
  errno = saved;
}

const char* res(long r, char* b, size_t n) {
  if (r < 0) {
    const char* name = strerrorname_np(errno);
    snprintf(b, n, "-1 %s", name ? name : "?");
  } else {
    snprintf(b, n, "%ld", r);
  }
  return b;
}
#define R(expr) res(static_cast<long>(expr), rb, sizeof rb)

bool read_n(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Sends one framed message with a plain write and reads the echo with read.
bool roundtrip(int fd, const char* msg) {
  char out[256], in[256];
  size_t n = strlen(msg);
  out[0] = static_cast<char>(n);
  memcpy(out + 1, msg, n);
  if (write(fd, out, n + 1) != static_cast<ssize_t>(n + 1)) return false;
  return read_n(fd, in, n + 1) && memcmp(in, out, n + 1) == 0;
}

__attribute__((constructor)) void diff_ctor_init() {
  const char* port_s = getenv("DIFF_CTOR_PORT");
  if (!port_s) return;
  char rb[64];
  line("constructor runs before main");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  line("socket ok: %s", fd >= 0 ? "yes" : "no");
  int one = 1;
  line("setsockopt(TCP_NODELAY) = %s", R(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(atoi(port_s)));
  line("connect = %s", R(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a)));
  sockaddr_in s{};
  socklen_t len = sizeof s;
  line("getsockname = %s", R(getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len)));
  len = sizeof s;
  int gp = getpeername(fd, reinterpret_cast<sockaddr*>(&s), &len);
  line("getpeername = %s, port matches: %s", R(gp), s.sin_port == a.sin_port ? "yes" : "no");
  int v = -1;
  len = sizeof v;
  int go = getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len);
  line("getsockopt(TCP_NODELAY) = %s, value %d", R(go), v);
  line("fcntl(F_GETFL) O_NONBLOCK: %s", (fcntl(fd, F_GETFL) & O_NONBLOCK) ? "yes" : "no");

  line("write/read round trip: %s", roundtrip(fd, "write-read") ? "ok" : "FAILED");
  {
    char out[] = "\x04send", in[5];
    line("send = %s", R(send(fd, out, 5, 0)));
    ssize_t n = recv(fd, in, 5, MSG_WAITALL);
    line("recv = %s, echo ok: %s", R(n), memcmp(in, out, 5) == 0 ? "yes" : "no");
  }
  {
    char out[] = "\x06sendto", in[7];
    line("sendto = %s", R(sendto(fd, out, 7, 0, nullptr, 0)));
    ssize_t n = recvfrom(fd, in, 7, MSG_WAITALL, nullptr, nullptr);
    line("recvfrom = %s, echo ok: %s", R(n), memcmp(in, out, 7) == 0 ? "yes" : "no");
  }
  {
    char hdr = 6, body[] = "writev", in1[1], in2[6];
    iovec w[2] = {{&hdr, 1}, {body, 6}};
    line("writev = %s", R(writev(fd, w, 2)));
    iovec r[2] = {{in1, 1}, {in2, 6}};
    ssize_t n = readv(fd, r, 2);  // 7 bytes in one segment: all there when readv wakes
    line("readv = %s, echo ok: %s", R(n), in1[0] == 6 && memcmp(in2, body, 6) == 0 ? "yes" : "no");
  }
  {
    char hdr = 7, body[] = "sendmsg", in[8];
    iovec w[2] = {{&hdr, 1}, {body, 7}};
    msghdr m{};
    m.msg_iov = w;
    m.msg_iovlen = 2;
    line("sendmsg = %s", R(sendmsg(fd, &m, 0)));
    iovec r{in, 8};
    msghdr mr{};
    mr.msg_iov = &r;
    mr.msg_iovlen = 1;
    ssize_t n = recvmsg(fd, &mr, MSG_WAITALL);
    line("recvmsg = %s, echo ok: %s", R(n), memcmp(in + 1, body, 7) == 0 ? "yes" : "no");
  }
  {
    write(fd, "\x04poll", 5);
    pollfd pf{fd, POLLIN, 0};
    int k = poll(&pf, 1, 5000);
    line("poll = %d, POLLIN: %s", k, (pf.revents & POLLIN) ? "yes" : "no");
    int avail = -1;
    ioctl(fd, FIONREAD, &avail);
    line("ioctl(FIONREAD) = %d", avail);
    char in[5];
    read_n(fd, in, 5);
  }
  {
    write(fd, "\x06select", 7);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    timeval tv{5, 0};
    int k = select(fd + 1, &rs, nullptr, nullptr, &tv);
    line("select = %d, readable: %s", k, FD_ISSET(fd, &rs) ? "yes" : "no");
    char in[7];
    read_n(fd, in, 7);
  }
  {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = 0xC7C7C7C7C7C7C7C7ull;
    line("epoll_create1 ok: %s; epoll_ctl = %s", ep >= 0 ? "yes" : "no", R(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e)));
    write(fd, "\x05""epoll", 6);
    epoll_event ev[2];
    int k = epoll_wait(ep, ev, 2, 5000);
    line("epoll_wait = %d, data intact: %s", k, k == 1 && ev[0].data.u64 == 0xC7C7C7C7C7C7C7C7ull ? "yes" : "no");
    char in[6];
    read_n(fd, in, 6);
    close(ep);
  }
  {
    int d = dup(fd);
    line("dup: round trip: %s", roundtrip(d, "via-dup") ? "ok" : "FAILED");
    close(d);
    d = dup2(fd, 150);
    line("dup2: round trip: %s", d == 150 && roundtrip(150, "via-dup2") ? "ok" : "FAILED");
    close(150);
    d = dup3(fd, 151, O_CLOEXEC);
    line("dup3: round trip: %s", d == 151 && roundtrip(151, "via-dup3") ? "ok" : "FAILED");
    close(151);
    d = fcntl(fd, F_DUPFD_CLOEXEC, 160);
    line("F_DUPFD_CLOEXEC: round trip: %s", d >= 160 && roundtrip(d, "via-dupfd") ? "ok" : "FAILED");
    close(d);
  }
  {
    // listen + accept: the server connects back to us.
    int l = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in la{};
    la.sin_family = AF_INET;
    la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(l, reinterpret_cast<sockaddr*>(&la), sizeof la);
    line("listen = %s", R(listen(l, 4)));
    len = sizeof la;
    getsockname(l, reinterpret_cast<sockaddr*>(&la), &len);
    char req[3] = {0};
    memcpy(req + 1, &la.sin_port, 2);
    write(fd, req, 3);
    int c = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    line("accept4 ok: %s", c >= 0 ? "yes" : "no");
    char in[8];
    bool ok = read_n(c, in, 8) && memcmp(in, "reverse!", 8) == 0;
    line("accepted connection: got \"reverse!\": %s; write back = %s", ok ? "yes" : "no", R(write(c, in, 8)));
    char r = 0;
    read_n(fd, &r, 1);
    line("server confirmed: %s", r == 'R' ? "yes" : "no");
    close(c);
    close(l);
  }
  line("shutdown(SHUT_WR) = %s", R(shutdown(fd, SHUT_WR)));
  char c;
  line("read after the server closed = %s", R(read(fd, &c, 1)));
  line("close = %s", R(close(fd)));
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const char* diff_ctor_transcript() { return g_buf; }
