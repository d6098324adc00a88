// Seccomp filters for tests: a sandbox as programs install them (OpenSSH's
// pre-authentication child, systemd's SystemCallFilter=), and an "old kernel"
// that lacks a system call (ENOSYS). Raw classic BPF, no libseccomp.
//
//   seccomp_allow_only({__NR_read, __NR_write, ...}, SECCOMP_RET_KILL_PROCESS)
//   seccomp_fail_with({__NR_epoll_pwait2}, ENOSYS)
//
// Both set PR_SET_NO_NEW_PRIVS first (required without CAP_SYS_ADMIN) and
// return 0 or -errno. x86-64 only: any other architecture is refused by the
// filter itself (tests that use it are skipped elsewhere).
#pragma once

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <initializer_list>
#include <vector>

namespace rdmashim::test {

// A filter: listed calls get `listed`, every other call gets `others`.
inline int seccomp_install(std::initializer_list<int> calls, unsigned listed, unsigned others) {
  std::vector<sock_filter> f;
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)));
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
  for (int nr : calls) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(nr), 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, listed));
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, others));
  sock_fprog prog{static_cast<unsigned short>(f.size()), f.data()};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -errno;
  // The raw system call: a preloaded prctl() hook must not see or alter it.
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) return -errno;
  return 0;
}

// Only `allowed` calls run; any other kills the process with SIGSYS (or
// fails with `errno_for_others` when that is non-zero).
inline int seccomp_allow_only(std::initializer_list<int> allowed, int errno_for_others = 0) {
  unsigned others = errno_for_others ? SECCOMP_RET_ERRNO | (static_cast<unsigned>(errno_for_others) & 0xffff)
                                     : SECCOMP_RET_KILL_PROCESS;
  return seccomp_install(allowed, SECCOMP_RET_ALLOW, others);
}

// The listed calls fail with `err` (ENOSYS: a kernel that lacks them).
inline int seccomp_fail_with(std::initializer_list<int> calls, int err) {
  return seccomp_install(calls, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & 0xffff), SECCOMP_RET_ALLOW);
}

}  // namespace rdmashim::test
