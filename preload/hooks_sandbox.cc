// Seccomp sandboxes: noticing one at start-up (/proc/self/status) and when
// the program installs one through prctl(), so that rdmashim settles its
// handshakes and stops making calls of its own before the filter can bite.
// The data path keeps to the program's own calls anyway (sys/calls.h).
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstring>

#include "preload.h"
#include "util/process.h"
#include "util/user_copy.h"

using namespace rdmashim;
using namespace rdmashim::preload;

namespace rdmashim::preload {

// "Seccomp:\t2" (a filter) or "NoNewPrivs:\t1" (the usual step before one)
// in /proc/self/status when we load.
void detect_inherited_sandbox() {
  int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[4096];
  ssize_t n = real().read(fd, buf, sizeof buf - 1);
  real().close(fd);
  if (n <= 0) return;
  buf[n] = '\0';
  const char* s = strstr(buf, "\nSeccomp:");
  const char* p = strstr(buf, "\nNoNewPrivs:");
  bool filter = s && atoi(s + strlen("\nSeccomp:")) != 0;
  bool nnp = p && atoi(p + strlen("\nNoNewPrivs:")) != 0;
  if (filter || nnp) note_sandbox(Sandbox::kInherited);
}

}  // namespace rdmashim::preload

extern "C" {

int prctl(int option, ...) {
  va_list ap;
  va_start(ap, option);
  unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long);
  unsigned long a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
  va_end(ap);
  using Fn = int (*)(int, ...);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "prctl"));
  bool seccomp = option == PR_SET_SECCOMP && (a2 == SECCOMP_MODE_FILTER || a2 == SECCOMP_MODE_STRICT);
  if ((option == PR_SET_NO_NEW_PRIVS && a2 == 1) || seccomp) {
    int saved = errno;
    // NO_NEW_PRIVS alone is often just that (HAProxy sets it against setuid
    // programs): upgrades go on; a filter may follow through syscall(), so
    // no spinning and the options are read now.
    note_sandbox(seccomp ? Sandbox::kInstalling : Sandbox::kInherited);
    prepare_user_copy();  // sigaction: not allowed once the filter is in
    table().for_each_fd([](int fd) {
      Ref e = table().get(fd);
      if (e && e->conn) e->conn->settle_before_sandbox();
    });
    errno = saved;
  }
  if (!next) {
    errno = ENOSYS;
    return -1;
  }
  return next(option, a2, a3, a4, a5);
}

}  // extern "C"
