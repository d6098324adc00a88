// Runs a command as if on an older kernel: the named system calls fail with
// ENOSYS (a seccomp filter, inherited across exec).
//
// usage: seccomp_run --enosys NAME[,NAME...] -- CMD [ARGS...]
// NAME is one of the table below or a system call number.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "support/seccomp_filter.h"

namespace {

struct Named {
  const char* name;
  int nr;
};
// The calls rdmashim may rely on that a kernel older than 5.15 can lack.
constexpr Named kCalls[] = {
    {"epoll_pwait2", __NR_epoll_pwait2}, {"close_range", __NR_close_range},
    {"memfd_create", __NR_memfd_create}, {"pidfd_open", __NR_pidfd_open},
    {"faccessat2", __NR_faccessat2},     {"openat2", __NR_openat2},
};

int lookup(const std::string& name) {
  for (const Named& c : kCalls)
    if (name == c.name) return c.nr;
  char* end = nullptr;
  long v = strtol(name.c_str(), &end, 10);
  return (!name.empty() && *end == '\0' && v >= 0) ? static_cast<int>(v) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> nrs;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--enosys" && i + 1 < argc) {
      std::string list = argv[++i];
      size_t at = 0;
      while (at <= list.size()) {
        size_t comma = list.find(',', at);
        std::string name = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        int nr = lookup(name);
        if (nr < 0) {
          fprintf(stderr, "seccomp_run: unknown system call %s\n", name.c_str());
          return 2;
        }
        nrs.push_back(nr);
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else {
      break;
    }
  }
  if (i >= argc || nrs.empty()) {
    fprintf(stderr, "usage: seccomp_run --enosys NAME[,NAME...] -- CMD [ARGS...]\n");
    return 2;
  }
  // One filter per call keeps seccomp_filter.h's interface a plain list.
  for (int nr : nrs) {
    if (int err = rdmashim::test::seccomp_fail_with({nr}, ENOSYS); err != 0) {
      fprintf(stderr, "seccomp_run: cannot install the filter: %s\n", strerror(-err));
      return 77;
    }
  }
  execvp(argv[i], argv + i);
  fprintf(stderr, "seccomp_run: %s: %s\n", argv[i], strerror(errno));
  return 127;
}
