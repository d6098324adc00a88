#include "util/spin.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "sys/sys.h"
#include "util/config.h"
#include "util/misc.h"
#include "util/process.h"

namespace rdmashim {
namespace {

constexpr uint64_t kSampleNs = 2'000'000;
std::atomic<uint64_t> g_next_sample{0};
std::atomic<bool> g_oversubscribed{false};

int cpus() {
  static const int n = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? static_cast<int>(c) : 1;
  }();
  return n;
}

// The fourth field of /proc/loadavg is "running/total".
int runnable_tasks() {
  int saved = errno;
  int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  char buf[128];
  ssize_t n = fd >= 0 ? sys::real().read(fd, buf, sizeof buf - 1) : -1;
  if (fd >= 0) sys::real().close(fd);
  errno = saved;
  if (n <= 0) return 0;
  buf[n] = '\0';
  int fields = 0;
  for (char* p = buf; *p; ++p) {
    if (*p == ' ' && ++fields == 3) return atoi(p + 1);
  }
  return 0;
}

}  // namespace

uint32_t spin_budget_us() {
  uint32_t budget = config().spin_us;
  // Spinning yields the core and samples /proc/loadavg: calls a sandbox may forbid.
  if (budget == 0 || sandbox() != Sandbox::kNone) return 0;
  uint64_t now = now_ns();
  uint64_t next = g_next_sample.load(std::memory_order_relaxed);
  if (now >= next && g_next_sample.compare_exchange_strong(next, now + kSampleNs, std::memory_order_relaxed)) {
    // Counting ourselves: spinning is fine while every runnable task has a core.
    g_oversubscribed.store(runnable_tasks() > cpus(), std::memory_order_relaxed);
  }
  return g_oversubscribed.load(std::memory_order_relaxed) ? 0 : budget;
}

}  // namespace rdmashim
