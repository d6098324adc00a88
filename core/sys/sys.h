// The kernel-facing calls rdmashim itself makes, resolved once.
//
// Inside the preload, core code must never call `::recv` and friends by name:
// those names resolve to our own hooks. Everything goes through `sys::real()`,
// a table filled by dlsym. The preload fills it with the next definition after
// itself (so other preloads still chain); programs that link the core directly
// (the tools) fill it from libc, so running them under the preload cannot
// layer rdmashim twice.
#pragma once

#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

namespace rdmashim::sys {

struct Table {
  int (*socket)(int, int, int);
  int (*bind)(int, const sockaddr*, socklen_t);
  int (*listen)(int, int);
  int (*accept)(int, sockaddr*, socklen_t*);
  int (*accept4)(int, sockaddr*, socklen_t*, int);
  int (*connect)(int, const sockaddr*, socklen_t);
  int (*close)(int);
  ssize_t (*read)(int, void*, size_t);
  ssize_t (*write)(int, const void*, size_t);
  ssize_t (*readv)(int, const iovec*, int);
  ssize_t (*writev)(int, const iovec*, int);
  ssize_t (*recv)(int, void*, size_t, int);
  ssize_t (*send)(int, const void*, size_t, int);
  ssize_t (*recvfrom)(int, void*, size_t, int, sockaddr*, socklen_t*);
  ssize_t (*sendto)(int, const void*, size_t, int, const sockaddr*, socklen_t);
  ssize_t (*recvmsg)(int, msghdr*, int);
  ssize_t (*sendmsg)(int, const msghdr*, int);
  int (*shutdown)(int, int);
  int (*getpeername)(int, sockaddr*, socklen_t*);
  int (*getsockname)(int, sockaddr*, socklen_t*);
  int (*getsockopt)(int, int, int, void*, socklen_t*);
  int (*setsockopt)(int, int, int, const void*, socklen_t);
  int (*fcntl)(int, int, ...);
  int (*ioctl)(int, unsigned long, ...);
  int (*poll)(pollfd*, nfds_t, int);
  int (*ppoll)(pollfd*, nfds_t, const timespec*, const sigset_t*);
  int (*select)(int, fd_set*, fd_set*, fd_set*, timeval*);
  int (*pselect)(int, fd_set*, fd_set*, fd_set*, const timespec*, const sigset_t*);
  int (*epoll_create)(int);
  int (*epoll_create1)(int);
  int (*epoll_ctl)(int, int, int, epoll_event*);
  int (*epoll_wait)(int, epoll_event*, int, int);
  int (*epoll_pwait)(int, epoll_event*, int, int, const sigset_t*);
  int (*epoll_pwait2)(int, epoll_event*, int, const timespec*, const sigset_t*);
  int (*dup)(int);
  int (*dup2)(int, int);
  int (*dup3)(int, int, int);
  pid_t (*fork)();
  int (*recvmmsg)(int, mmsghdr*, unsigned int, int, timespec*);
  int (*sendmmsg)(int, mmsghdr*, unsigned int, int);
  ssize_t (*sendfile)(int, int, off_t*, size_t);
  ssize_t (*splice)(int, loff_t*, int, loff_t*, size_t, unsigned int);
  ssize_t (*pread)(int, void*, size_t, off_t);
};

enum class Source {
  kLibc,        // libc's own definitions (tools linking the core directly)
  kNextObject,  // the next definition after the calling object (the preload)
};

// Chooses where the table comes from. Only the first call has an effect;
// real() resolves with kLibc if nobody chose.
void init(Source source);

// The resolved table. Safe to call from any thread, at any time, including
// from another library's constructor before ours ran.
const Table& real();

// Waits on an epoll set with a nanosecond timeout (nullptr: forever):
// epoll_pwait2 where the kernel (5.11+) and libc have it, else epoll_pwait
// with the timeout rounded up to whole milliseconds so it never returns
// early.
int epoll_wait_ts(int epfd, epoll_event* ev, int max, const timespec* ts, const sigset_t* mask);
// The kernel (before 5.11) or libc lacks epoll_pwait2; probed once.
bool epoll_pwait2_missing();

}  // namespace rdmashim::sys
