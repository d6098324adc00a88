// Network namespaces: a thread that moves to another (setns, unshare) would
// otherwise probe abstract names and ask sock_diag through the process's
// reused sockets, which answer for the namespace they were opened in
// (util/reused_socket.h). From the first move on the process reuses none.
#include <dlfcn.h>
#include <sched.h>

#include <cerrno>

#include "util/reused_socket.h"

using rdmashim::ReusedSocket;

extern "C" {

int setns(int fd, int nstype) {
  using Fn = int (*)(int, int);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "setns"));
  // 0: any type (a namespace fd); a pidfd names a set of CLONE_NEW* flags.
  if (nstype == 0 || (nstype & CLONE_NEWNET)) ReusedSocket::stop_after_namespace_move();
  if (!next) {
    errno = ENOSYS;
    return -1;
  }
  return next(fd, nstype);
}

int unshare(int flags) {
  using Fn = int (*)(int);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "unshare"));
  if (flags & CLONE_NEWNET) ReusedSocket::stop_after_namespace_move();
  if (!next) {
    errno = ENOSYS;
    return -1;
  }
  return next(flags);
}

}  // extern "C"
