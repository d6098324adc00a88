// The client's side: the connection sent its Hello; the fuzzer's bytes are
// the server's answer (an Ack, its Params frame, then frames, or anything
// else). The Ack must echo the Hello's random nonce, which a fuzzer cannot
// guess: when the input starts with the Ack magic, the nonce is copied in
// unless the first byte's top bit asks for the input as it is.
// A loopback TCP pair (make_client offers shared memory only to a peer on
// this host), in-process, closed with a reset so no TIME_WAIT piles up.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "conn/connection.h"
#include "drive.h"
#include "fuzz_common.h"
#include "wire/wire.h"

namespace {
int g_listener = -1;
sockaddr_in g_addr{};
// A fresh client socket connected to the listener. Ephemeral ports are shared
// with everything else on the host: when they run out for a moment, wait.
// Any other failure (descriptors leaked by the code under test, the
// listener closed under us) is a finding.
int connect_loopback() {
  for (int attempt = 0;; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&g_addr), sizeof g_addr) == 0) return fd;
    int err = errno;
    if (fd >= 0 && err == EINTR) {
      // libFuzzer's SIGALRM landed in a slow connect (a SYN retransmitted):
      // the connect goes on; wait for its end.
      pollfd p{fd, POLLOUT, 0};
      socklen_t len = sizeof err;
      if (poll(&p, 1, 5000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) return fd;
      if (err == 0) err = ETIMEDOUT;
    }
    if (fd >= 0) close(fd);
    if ((err != EADDRNOTAVAIL && err != EAGAIN) || attempt == 500) {
      fprintf(stderr, "fuzz_client: cannot connect: %s\n", strerror(err));
      abort();
    }
    usleep(10000);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rdmashim::fuzz::quiet_fast_config();
  g_listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  g_addr.sin_family = AF_INET;
  g_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof g_addr;
  if (bind(g_listener, reinterpret_cast<sockaddr*>(&g_addr), sizeof g_addr) != 0 || listen(g_listener, 16) != 0 ||
      getsockname(g_listener, reinterpret_cast<sockaddr*>(&g_addr), &len) != 0) {
    abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 65536) return -1;
  uint8_t style = data[0];
  int fd = connect_loopback();
  int peer = accept4(g_listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (peer < 0) abort();
  int one = 1;
  setsockopt(peer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  rdmashim::fuzz::set_nonblocking(fd);
  {
    auto c = rdmashim::Connection::make_client(fd);
    if (c) {
      // The Hello is on its way (sent whole by make_client): take it.
      rdmashim::wire::Hello hello{};
      ssize_t got = 0;
      while (got < static_cast<ssize_t>(sizeof hello)) {
        ssize_t n = recv(peer, reinterpret_cast<char*>(&hello) + got, sizeof hello - got, 0);
        if (n <= 0) abort();  // make_client promised the whole Hello
        got += n;
      }
      std::vector<uint8_t> answer(data + 1, data + size);
      if (!(style & 0x80) && answer.size() >= 32 &&
          memcmp(answer.data(), rdmashim::wire::kAckMagic, sizeof rdmashim::wire::kAckMagic) == 0) {
        memcpy(answer.data() + offsetof(rdmashim::wire::Ack, nonce), hello.nonce, sizeof hello.nonce);
      }
      rdmashim::fuzz::peer_sends(peer, answer.data(), answer.size());
      rdmashim::fuzz::drive(*c, style);
    }
  }
  rdmashim::fuzz::close_hard(fd);
  rdmashim::fuzz::close_hard(peer);
  return 0;
}
