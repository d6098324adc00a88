// A connection upgraded to shared memory keeps working after the process
// confines itself with a strict seccomp filter that allows only what the
// program itself calls (read/write/poll, shutdown/close) plus what the C
// runtime needs: any other call rdmashim made would kill it with SIGSYS.
//
//   sandboxed_stream blocking|poll
//
// Forks: the parent listens and accepts (server), the child connects
// (client); both run under the preload. They exchange one line (the
// handshake ends, the connection goes to the ring), then each installs the
// filter and they stream 8 MiB each way (blocking: one way then the other;
// poll: both at once on non-blocking sockets), SHA-256 checked, then
// shutdown(SHUT_WR), read to EOF, close. Exit 0 only if both sides saw every
// byte; the caller checks the RDMASHIM_LOG=info lines say shm.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "support/seccomp_filter.h"
#include "support/sha256.h"

namespace {

constexpr size_t kBytes = 8u << 20;
bool g_poll = false;

void die(const char* what) {
  fprintf(stderr, "sandboxed_stream: %s: %s\n", what, strerror(errno));
  _exit(2);
}

// The bytes one side sends: a cheap deterministic generator.
void fill(unsigned char* b, size_t n, uint64_t& state) {
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b[i] = static_cast<unsigned char>(state >> 56);
  }
}

std::string expected_hash(uint64_t seed) {
  rdmashim::test::Sha256 h;
  unsigned char buf[65536];
  for (size_t done = 0; done < kBytes; done += sizeof buf) {
    fill(buf, sizeof buf, seed);
    h.update(buf, sizeof buf);
  }
  return h.hex();
}

void sandbox() {
  int r = rdmashim::test::seccomp_allow_only({__NR_read, __NR_write, __NR_poll, __NR_ppoll, __NR_shutdown,
                                              __NR_close, __NR_exit, __NR_exit_group, __NR_rt_sigreturn,
                                              __NR_rt_sigprocmask, __NR_futex, __NR_clock_gettime, __NR_brk,
                                              __NR_mmap, __NR_munmap, __NR_mremap, __NR_madvise});
  if (r != 0) die("seccomp");
}

// Streams kBytes of `seed` out while hashing what comes in until EOF.
bool stream(int fd, uint64_t out_seed, uint64_t in_seed, bool first_sender) {
  std::string want = expected_hash(in_seed);  // before the filter needs nothing more
  sandbox();
  rdmashim::test::Sha256 got;
  size_t got_bytes = 0, sent = 0, have = 0, off = 0;
  unsigned char out[65536], in[65536];
  bool in_done = false, out_done = false;
  auto send_some = [&](bool once) {
    while (sent < kBytes) {
      if (off == have) {
        fill(out, sizeof out, out_seed);
        have = sizeof out;
        off = 0;
      }
      ssize_t n = write(fd, out + off, have - off);
      if (n < 0) {
        if (errno == EAGAIN) return true;
        return false;
      }
      off += static_cast<size_t>(n);
      sent += static_cast<size_t>(n);
      if (once) return true;
    }
    if (!out_done) {
      out_done = true;
      if (shutdown(fd, SHUT_WR) != 0) return false;
    }
    return true;
  };
  auto recv_some = [&](bool once) {
    for (;;) {
      ssize_t n = read(fd, in, sizeof in);
      if (n == 0) {
        in_done = true;
        return true;
      }
      if (n < 0) return errno == EAGAIN;
      got.update(in, static_cast<size_t>(n));
      got_bytes += static_cast<size_t>(n);
      if (once) return true;
    }
  };
  if (!g_poll) {
    // Half duplex: the client sends first, then reads the answer.
    if (first_sender) {
      if (!send_some(false) || !recv_some(false)) return false;
    } else {
      if (!recv_some(false) || !send_some(false)) return false;
    }
  } else {
    while (!in_done || !out_done) {
      pollfd p{fd, static_cast<short>((in_done ? 0 : POLLIN) | (out_done ? 0 : POLLOUT)), 0};
      if (poll(&p, 1, 10000) <= 0) return false;
      if ((p.revents & (POLLIN | POLLHUP | POLLERR)) && !in_done && !recv_some(true)) return false;
      if ((p.revents & POLLOUT) && !out_done && !send_some(true)) return false;
    }
  }
  bool ok = got_bytes == kBytes && got.hex() == want;
  close(fd);
  return ok;
}

void greet(int fd, const char* line) {
  char buf[16];
  if (write(fd, line, 6) != 6) die("write greeting");
  size_t have = 0;
  while (have < 6) {
    ssize_t n = read(fd, buf + have, 6 - have);
    if (n <= 0) die("read greeting");
    have += static_cast<size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || (strcmp(argv[1], "blocking") != 0 && strcmp(argv[1], "poll") != 0)) {
    fprintf(stderr, "usage: sandboxed_stream blocking|poll\n");
    return 2;
  }
  g_poll = strcmp(argv[1], "poll") == 0;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    die("listen");
  }
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    close(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
    greet(c, "hello\n");
    if (g_poll && fcntl(c, F_SETFL, O_NONBLOCK) != 0) die("fcntl");
    bool ok = stream(c, 1, 2, true);
    const char* msg = ok ? "client: ok\n" : "client: FAILED\n";
    (void)!write(2, msg, strlen(msg));
    _exit(ok ? 0 : 1);
  }
  int s = accept(l, nullptr, nullptr);
  if (s < 0) die("accept");
  close(l);
  greet(s, "howdy\n");
  if (g_poll && fcntl(s, F_SETFL, O_NONBLOCK) != 0) die("fcntl");
  bool ok = stream(s, 2, 1, false);
  // The filter forbids wait4: the test script checks each side's marker
  // line; a side killed by SIGSYS prints none.
  const char* msg = ok ? "server: ok\n" : "server: FAILED\n";
  (void)!write(2, msg, strlen(msg));
  return ok ? 0 : 1;
}
