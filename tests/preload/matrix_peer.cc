// matrix_peer: one end of a fallback-matrix run. Plain blocking sockets, no
// rdmashim API: the same binary runs with or without the preload.
//
//   matrix_peer server --port-file F --protocol client-first|server-first --bytes N
//   matrix_peer client --port P       --protocol client-first|server-first --bytes N
//
// Across hosts (tests/softroce): the server takes --bind ADDR (default
// 127.0.0.1) and a fixed --port P; the client takes --host ADDR and
// --connect-wait SECONDS (retry a refused or unreachable connect that long,
// because the two guests start at about the same time).
//
// client-first: the client sends N bytes and half-closes; the server reads to
//               EOF, answers N bytes and closes.
// server-first: the server greets first (a fixed line), then as above.
// Every I/O call family is used in turn (write, send, writev, sendmsg,
// sendto; read, recv, readv, recvmsg, recvfrom) with ragged sizes. Prints one
// JSON line with the count and SHA-256 of what it sent and received.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/sha256.h"

namespace {

using rdmashim::test::Sha256;

const char kGreeting[] = "220 matrix_peer ready\r\n";

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "matrix_peer: %s: %s\n", what, strerror(errno));
  exit(1);
}

struct Rng {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
};

void send_some(int fd, const char* p, size_t len, int call, Sha256& sent) {
  ssize_t n = -1;
  switch (call % 5) {
    case 0: n = write(fd, p, len); break;
    case 1: n = send(fd, p, len, 0); break;
    case 2: {
      size_t half = len / 2;
      iovec iov[2] = {{const_cast<char*>(p), half}, {const_cast<char*>(p) + half, len - half}};
      n = writev(fd, iov, 2);
      break;
    }
    case 3: {
      iovec iov{const_cast<char*>(p), len};
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      n = sendmsg(fd, &m, 0);
      break;
    }
    case 4: n = sendto(fd, p, len, 0, nullptr, 0); break;
  }
  if (n < 0) die("send");
  sent.update(p, static_cast<size_t>(n));
  if (static_cast<size_t>(n) < len) send_some(fd, p + n, len - static_cast<size_t>(n), call + 1, sent);
}

void send_stream(int fd, uint64_t bytes, uint64_t seed, Sha256& sent) {
  Rng rng{seed};
  std::vector<char> buf(1 << 17);
  uint64_t left = bytes;
  int call = 0;
  while (left > 0) {
    size_t len = 1 + rng.next() % buf.size();
    if (len > left) len = static_cast<size_t>(left);
    for (size_t i = 0; i < len; ++i) buf[i] = static_cast<char>(rng.next());
    send_some(fd, buf.data(), len, call++, sent);
    left -= len;
  }
}

// Reads until EOF, or exactly `limit` bytes when limit > 0.
void recv_stream(int fd, Sha256& got, uint64_t limit = 0) {
  std::vector<char> buf(1 << 17);
  Rng rng{99};
  for (int call = 0;; ++call) {
    size_t len = 1 + rng.next() % buf.size();
    if (limit > 0 && len > limit - got.bytes()) len = static_cast<size_t>(limit - got.bytes());
    ssize_t n = -1;
    switch (call % 5) {
      case 0: n = read(fd, buf.data(), len); break;
      case 1: n = recv(fd, buf.data(), len, 0); break;
      case 2: {
        size_t half = len / 2;
        iovec iov[2] = {{buf.data(), half}, {buf.data() + half, len - half}};
        n = readv(fd, iov, 2);
        break;
      }
      case 3: {
        iovec iov{buf.data(), len};
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        n = recvmsg(fd, &m, 0);
        break;
      }
      case 4: n = recvfrom(fd, buf.data(), len, 0, nullptr, nullptr); break;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      die("recv");
    }
    if (n == 0) {
      if (limit > 0) {
        errno = EPROTO;
        die("early EOF");
      }
      return;
    }
    got.update(buf.data(), static_cast<size_t>(n));
    if (limit > 0 && got.bytes() == limit) return;
  }
}

// Connects to host:port, retrying refused/unreachable attempts for up to
// wait_s seconds (a fresh socket each time). Returns the descriptor.
int connect_with_retry(const std::string& host, unsigned port, double wait_s) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    errno = EINVAL;
    die("--host must be an IPv4 address");
  }
  timespec start{}, now{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    int err = errno;
    close(fd);
    clock_gettime(CLOCK_MONOTONIC, &now);
    double waited = static_cast<double>(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
    bool retry = err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH || err == ETIMEDOUT;
    if (!retry || waited >= wait_s) {
      errno = err;
      die("connect");
    }
    usleep(100 * 1000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string role = argc > 1 ? argv[1] : "", port_file, protocol = "client-first";
  std::string host = "127.0.0.1", bind_addr = "127.0.0.1";
  double connect_wait = 0;
  uint64_t bytes = 1 << 20;
  unsigned port = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--port-file") port_file = argv[i + 1];
    else if (k == "--port") port = static_cast<unsigned>(atoi(argv[i + 1]));
    else if (k == "--protocol") protocol = argv[i + 1];
    else if (k == "--bytes") bytes = strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--host") host = argv[i + 1];
    else if (k == "--bind") bind_addr = argv[i + 1];
    else if (k == "--connect-wait") connect_wait = atof(argv[i + 1]);
  }
  bool server_first = protocol == "server-first";
  Sha256 sent, got;
  if (role == "server") {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, bind_addr.c_str(), &a.sin_addr) != 1) {
      errno = EINVAL;
      die("--bind must be an IPv4 address");
    }
    socklen_t len = sizeof a;
    if (bind(l, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(l, 4) != 0) die("listen");
    getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
    if (!port_file.empty()) {
      std::string tmp = port_file + ".tmp";
      FILE* f = fopen(tmp.c_str(), "w");
      if (!f) die("port file");
      fprintf(f, "%u\n", ntohs(a.sin_port));
      fclose(f);
      rename(tmp.c_str(), port_file.c_str());
    }
    int fd = accept(l, nullptr, nullptr);
    if (fd < 0) die("accept");
    if (server_first) send_some(fd, kGreeting, sizeof kGreeting - 1, 0, sent);
    recv_stream(fd, got);
    send_stream(fd, bytes, 2, sent);
    close(fd);
    close(l);
  } else if (role == "client") {
    int fd = connect_with_retry(host, port, connect_wait);
    if (server_first) recv_stream(fd, got, sizeof kGreeting - 1);
    send_stream(fd, bytes, 1, sent);
    if (shutdown(fd, SHUT_WR) != 0) die("shutdown");
    recv_stream(fd, got);
    close(fd);
  } else {
    fprintf(stderr, "usage: matrix_peer server|client ...\n");
    return 2;
  }
  unsigned long long sent_bytes = sent.bytes(), got_bytes = got.bytes();  // before hex() pads
  printf("{\"role\":\"%s\",\"sent\":%llu,\"sent_sha256\":\"%s\",\"received\":%llu,\"received_sha256\":\"%s\"}\n",
         role.c_str(), sent_bytes, sent.hex().c_str(), got_bytes, got.hex().c_str());
  return 0;
}
