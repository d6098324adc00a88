// Shared by tests that change process-wide limits: runs a check in a forked
// child with its own RLIMIT_NOFILE.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace rdmashim::test {

// Runs fn in a forked child with RLIMIT_NOFILE {soft, hard}; the child's
// exit status is the number of failed checks (99: it died, 100: the limit
// could not be set).
template <typename Fn>
int in_child(rlim_t soft, rlim_t hard, Fn fn) {
  pid_t pid = fork();
  if (pid == 0) {
    rlimit lim{soft, hard};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(100);
    _exit(fn());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

}  // namespace rdmashim::test
