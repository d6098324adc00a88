// Initialization: hooks called from another library's constructor, before
// main() and (under LD_PRELOAD) before the preloaded library's own
// constructor ran. The client is this binary re-executed with
// DIFF_CTOR_PORT set; libdiff_ctor.so (ctor_lib.cc) does the work.
#include <stdlib.h>

#include <sstream>

#include "sc_common.h"

extern "C" const char* diff_ctor_transcript();

using namespace diff;

EXEC_MODE(ctor_client) {
  set_role("ctor-process");
  unsetenv("DIFF_CTOR_PORT");
  std::istringstream in(diff_ctor_transcript());
  std::string l;
  int lines = 0;
  while (std::getline(in, l)) {
    T("%s", l.c_str());
    lines++;
  }
  if (lines == 0) T("the constructor recorded nothing");
  T("main runs");
}

SCENARIO(init_ctor_hooks, 4) {
  set_role("server");
  uint16_t port;
  int lfd = make_listener(&port);
  pid_t kid = spawn("ctor-process", [&] {
    close(lfd);
    reexec("ctor_client", {}, {"DIFF_CTOR_PORT=" + std::to_string(port)});
  });
  int fd = accept_one(lfd);
  int messages = 0;
  for (;;) {
    unsigned char len = 0;
    ssize_t n = read(fd, &len, 1);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      T("read = %s", E(n).c_str());
      break;
    }
    if (len == 0) {  // connect back to the constructor's listener
      uint16_t p;
      read_exact(fd, &p, 2);
      int r = connect_to(ntohs(p));
      write_all(r, "reverse!", 8);
      char b[8];
      read_exact(r, b, 8);
      T("reverse connection: echo ok: %s", yes(memcmp(b, "reverse!", 8) == 0).c_str());
      close(r);
      write_all(fd, "R", 1);
      continue;
    }
    char b[256];
    b[0] = static_cast<char>(len);
    read_exact(fd, b + 1, len);
    write_all(fd, b, len + 1u);
    messages++;
  }
  T("echoed %d messages, then EOF", messages);
  close(fd);
  reap(kid, "ctor-process");
}
