// Hooks around exec. The new program image loads rdmashim afresh with an
// empty descriptor table, so what it must know about inherited sockets is
// handed over in the environment:
//   RDMASHIM_INHERIT=<fd>[+<fd>...],...  accepted sockets no byte of which was
//                                    read or written yet (the inetd/sshd
//                                    pattern: accept, fork, dup2, exec);
//                                    '+' joins the names of one socket;
//   <names>=<state>                  a connection on a shared-memory ring:
//                                    its modes and transport descriptors
//                                    (kept open across exec), see
//                                    Connection::describe_for_exec(); a verbs
//                                    one leaves its ring first (its unread
//                                    bytes in a shared-memory ring, or none)
// The new image adopts them as fresh server-side connections, so a client's
// Hello is answered there instead of reaching the program as data.
// Connections further along cannot follow exec yet; a warning names them.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "conn/deferred_close.h"
#include "preload.h"
#include "util/log.h"
#include "wire/wire.h"

extern char** environ;

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

constexpr const char kInherit[] = "RDMASHIM_INHERIT";

using ExecveFn = int (*)(const char*, char* const[], char* const[]);
using ExecveatFn = int (*)(int, const char*, char* const[], char* const[], int);
using FexecveFn = int (*)(int, char* const[], char* const[]);
using ExecvpeFn = int (*)(const char*, char* const[], char* const[]);

template <typename Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

// "RDMASHIM_INHERIT=..." for the descriptors that survive exec, or "".
std::string inherit_entry() {
  std::vector<std::pair<Entry*, std::string>> groups;  // one socket, all its surviving names
  table().for_each_fd([&](int fd) {
    Ref e = table().get(fd);
    if (!e || !e->conn) return;
    int fdflags = real().fcntl(fd, F_GETFD);
    if (fdflags < 0 || (fdflags & FD_CLOEXEC)) return;
    // A ring that cannot follow exec (verbs) leaves it first (handover.cc):
    // its unread bytes then travel as a shared-memory ring's, or none is left.
    if (!e->conn->untouched_server()) {
      e->conn->settle_handshake();  // a verbs stream whose Ack was on its way is one now
      e->conn->hand_over_ring(wire::kDowngradeExec);
    }
    if (e->conn->passthrough()) return;
    auto g = std::find_if(groups.begin(), groups.end(), [&](auto& p) { return p.first == e.get(); });
    if (g == groups.end()) {
      groups.emplace_back(e.get(), std::to_string(fd));
    } else {
      g->second += "+" + std::to_string(fd);
    }
  });
  std::string list;
  for (auto& [entry, fds] : groups) {
    std::string state;
    if (!entry->conn->untouched_server()) {
      state = entry->conn->describe_for_exec();
      if (state.empty()) {
        RDMASHIM_WARN("fd %s survives exec in the middle of its upgrade; the new program cannot use it", fds.c_str());
        continue;
      }
    }
    list += (list.empty() ? "" : ",") + fds + (state.empty() ? "" : "=" + state);
  }
  return list.empty() ? std::string() : std::string(kInherit) + "=" + list;
}

// envp with our entry replacing any old one. The strings live in `keep`.
std::vector<char*> with_inherit(char* const envp[], std::string& keep) {
  // Sockets held for their Ack are close-on-exec: they finish first.
  if (deferred_close::any()) deferred_close::finish_all();
  std::vector<char*> out;
  keep = inherit_entry();
  for (char* const* p = envp; p && *p; ++p) {
    if (strncmp(*p, kInherit, sizeof kInherit - 1) == 0 && (*p)[sizeof kInherit - 1] == '=') continue;
    out.push_back(*p);
  }
  if (!keep.empty()) out.push_back(keep.data());
  out.push_back(nullptr);
  return out;
}

std::vector<char*> collect_args(const char* first, va_list ap, char*** envp_out) {
  std::vector<char*> args{const_cast<char*>(first)};
  while (char* a = va_arg(ap, char*)) args.push_back(a);
  args.push_back(nullptr);
  if (envp_out) *envp_out = va_arg(ap, char**);
  return args;
}

}  // namespace

namespace rdmashim::preload {

// At load: adopt what the previous image handed over, then forget it so a
// further exec does not see stale numbers.
void adopt_inherited() {
  const char* list = getenv(kInherit);
  if (!list) return;
  // <names>[=<state>] entries separated by ','; names are fds joined by '+'.
  const char* p = list;
  while (*p) {
    std::vector<int> names;
    char* end = nullptr;
    for (;;) {
      long fd = strtol(p, &end, 10);
      if (end == p || fd < 0 || fd > INT32_MAX) {
        unsetenv(kInherit);  // malformed: adopt nothing more
        return;
      }
      names.push_back(static_cast<int>(fd));
      p = end;
      if (*p != '+') break;
      ++p;
    }
    std::string state;
    if (*p == '=') {
      const char* stop = strchr(p, ',');
      state.assign(p + 1, stop ? static_cast<size_t>(stop - p - 1) : strlen(p + 1));
      p += 1 + state.size();
    }
    adopt_socket(names, state);
    if (*p == ',') ++p;
  }
  unsetenv(kInherit);
}

}  // namespace rdmashim::preload

extern "C" {

int execve(const char* path, char* const argv[], char* const envp[]) {
  std::string keep;
  auto env = with_inherit(envp, keep);
  static ExecveFn fn = next<ExecveFn>("execve");
  return fn(path, argv, env.data());
}

int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
  std::string keep;
  auto env = with_inherit(envp, keep);
  static ExecveatFn fn = next<ExecveatFn>("execveat");
  return fn(dirfd, path, argv, env.data(), flags);
}

int fexecve(int fd, char* const argv[], char* const envp[]) {
  std::string keep;
  auto env = with_inherit(envp, keep);
  static FexecveFn fn = next<FexecveFn>("fexecve");
  return fn(fd, argv, env.data());
}

int execvpe(const char* file, char* const argv[], char* const envp[]) {
  std::string keep;
  auto env = with_inherit(envp, keep);
  static ExecvpeFn fn = next<ExecvpeFn>("execvpe");
  return fn(file, argv, env.data());
}

int execv(const char* path, char* const argv[]) { return execve(path, argv, environ); }
int execvp(const char* file, char* const argv[]) { return execvpe(file, argv, environ); }

int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  auto args = collect_args(arg, ap, nullptr);
  va_end(ap);
  return execve(path, args.data(), environ);
}

int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  auto args = collect_args(arg, ap, nullptr);
  va_end(ap);
  return execvpe(file, args.data(), environ);
}

int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  char** envp = nullptr;
  auto args = collect_args(arg, ap, &envp);
  va_end(ap);
  return execve(path, args.data(), envp);
}

}  // extern "C"
