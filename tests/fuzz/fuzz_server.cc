// The server's side of the handshake and of the framed stream: the fuzzer's
// bytes are what a client (hostile or broken) sends to an accepted socket:
// a Hello, its Params frame, then DATA/Switch/Plain/Close/Ping/Urgent frames,
// or anything else. The Connection runs in-process over a socketpair.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "conn/connection.h"
#include "drive.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rdmashim::fuzz::quiet_fast_config();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 65536) return -1;
  uint8_t style = data[0];  // how the application reads; the rest is the peer's
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  rdmashim::fuzz::set_nonblocking(sv[0]);
  rdmashim::fuzz::peer_sends(sv[1], data + 1, size - 1);
  {
    auto c = rdmashim::Connection::make_server(sv[0]);
    if (c) rdmashim::fuzz::drive(*c, style);
  }
  close(sv[0]);
  close(sv[1]);
  return 0;
}
