#include "util/log.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "sys/sys.h"
#include "util/misc.h"

namespace rdmashim::log {
namespace {

// Set once at startup (config), read per line; a torn read is impossible
// because the path is only ever replaced before the first line is logged.
char g_file[PATH_MAX];
std::atomic<bool> g_to_file{false};

// The pid every line starts with, asked once per process: glibc no longer
// caches getpid(), and a call per line doubled what an info line per
// connection costs. A forked child asks again.
std::atomic<int> g_pid{0};
int line_pid() {
  int pid = g_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] { pthread_atfork(nullptr, nullptr, [] { g_pid.store(0, std::memory_order_relaxed); }); });
    pid = static_cast<int>(getpid());
    g_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

}  // namespace

void prime_pid() { (void)line_pid(); }

void set_file(const char* path) {
  if (!path || !*path || strlen(path) >= sizeof g_file) {
    g_to_file.store(false, std::memory_order_release);
    return;
  }
  memcpy(g_file, path, strlen(path) + 1);
  g_to_file.store(true, std::memory_order_release);
}

bool RateLimit::admit(uint64_t now, uint64_t* dropped) {
  uint64_t start = window_start_.load(std::memory_order_relaxed);
  if (start == 0 || now - start >= kWindowNs) {
    // A new window; one thread wins the reset, the others count in it.
    if (window_start_.compare_exchange_strong(start, now ? now : 1, std::memory_order_relaxed)) {
      in_window_.store(0, std::memory_order_relaxed);
    }
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) >= kBurst) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *dropped = dropped_.exchange(0, std::memory_order_relaxed);
  return true;
}

void write(int level, RateLimit* limit, const char* fmt, ...) {
  int saved = errno;  // logging must never disturb the errno a hook returns
  uint64_t dropped = 0;
  if (limit && !limit->admit(now_ns(), &dropped)) {
    errno = saved;
    return;
  }
  static const char* const kNames[] = {"", "warn", "info", "debug"};
  char line[512];
  int n = snprintf(line, sizeof line, "rdmashim[%d] %s: ", line_pid(),
                   kNames[level & 3]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof line - 2) len = sizeof line - 2;
  if (dropped > 0) {
    int k = snprintf(line + len, sizeof line - len - 1, " (%llu similar lines dropped)",
                     static_cast<unsigned long long>(dropped));
    len += k < 0 ? 0 : static_cast<size_t>(k);
    if (len > sizeof line - 2) len = sizeof line - 2;
  }
  line[len++] = '\n';
  // One write(2) so lines from several processes do not interleave. The file
  // is opened per line: our descriptor never lives where the program could
  // close it or get it back from open() as its own.
  int fd = STDERR_FILENO;
  if (g_to_file.load(std::memory_order_acquire)) {
    fd = open(g_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fd = STDERR_FILENO;
  }
  ssize_t ignored = sys::real().write(fd, line, len);
  (void)ignored;
  if (fd != STDERR_FILENO) sys::real().close(fd);
  errno = saved;
}

}  // namespace rdmashim::log
