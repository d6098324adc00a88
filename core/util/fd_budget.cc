#include "util/fd_budget.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>

#include "sys/sys.h"
#include "util/fd_bitmap.h"
#include "util/process.h"

namespace rdmashim::fds {
namespace {

// How far above the soft limit we raise it for one move (the kernel's table
// grows to cover what is used, not what is allowed).
constexpr rlim_t kAboveSpan = 1 << 16;
// Below the soft limit our descriptors live in its top 1/kZoneShare.
constexpr rlim_t kZoneShare = 16;
constexpr rlim_t kMinZone = 8;

std::mutex g_mu;  // one raise-and-restore at a time
std::atomic<int> g_promised{0};  // see Promise

// Which descriptors are ours (numbers beyond the bitmap are not tracked).
FdBitmap g_ours;
std::atomic<unsigned> g_highest{0};  // bound for scans: no bit above it

void mark(int fd) {
  if (fd < 0 || static_cast<unsigned>(fd) >= FdBitmap::kBits) return;
  g_ours.set(fd);
  unsigned h = g_highest.load(std::memory_order_relaxed);
  while (h < static_cast<unsigned>(fd) &&
         !g_highest.compare_exchange_weak(h, static_cast<unsigned>(fd), std::memory_order_relaxed)) {
  }
}

void close_all(int* fds, int n) {
  for (int i = 0; i < n; ++i) {
    if (fds[i] >= 0) sys::real().close(fds[i]);
    fds[i] = -1;
  }
}

// Duplicates every fds[i] at or above `from`; replaces and closes the
// originals only if all of them moved, and below `end - later`.
bool move_all(int* fds, int n, int from, rlim_t end, int later) {
  int moved[8];
  if (n > 8) return false;
  later += g_promised.load(std::memory_order_relaxed);
  int i = 0;
  for (; i < n; ++i) {
    moved[i] = sys::real().fcntl(fds[i], F_DUPFD_CLOEXEC, from);
    if (moved[i] < 0 || static_cast<rlim_t>(moved[i]) + static_cast<rlim_t>(later) >= end) {
      if (moved[i] >= 0) ++i;
      break;
    }
  }
  if (i == n && n > 0 && static_cast<rlim_t>(moved[n - 1]) + static_cast<rlim_t>(later) < end) {
    for (int k = 0; k < n; ++k) {
      sys::real().close(fds[k]);
      fds[k] = moved[k];
    }
    return true;
  }
  for (int k = 0; k < i; ++k) sys::real().close(moved[k]);
  return false;
}

// Above the soft limit: raised for the moves, then put back (g_mu held).
// Another thread of the program opening a descriptor meanwhile gets the
// number it would have had (the lowest free one), unless none was free
// below the limit.
bool move_above(int* fds, int n, const rlimit& lim, int later) {
  if (sandbox() != Sandbox::kNone || lim.rlim_cur == RLIM_INFINITY || lim.rlim_max <= lim.rlim_cur ||
      lim.rlim_cur > static_cast<rlim_t>(INT32_MAX) - kAboveSpan) {
    return false;
  }
  rlimit raised = lim;
  raised.rlim_cur = std::min<rlim_t>(lim.rlim_max, lim.rlim_cur + kAboveSpan);
  if (setrlimit(RLIMIT_NOFILE, &raised) != 0) return false;  // above nr_open, say: stay below
  bool ok = move_all(fds, n, static_cast<int>(lim.rlim_cur), raised.rlim_cur, later);
  setrlimit(RLIMIT_NOFILE, &lim);
  return ok;
}

bool move_into_zone(int* fds, int n, const rlimit& lim, int later) {
  rlim_t limit = std::min<rlim_t>(lim.rlim_cur, static_cast<rlim_t>(INT32_MAX));
  rlim_t zone = std::max(kMinZone, limit / kZoneShare);
  if (limit <= zone * 2) return false;  // a tiny limit: all of it is the program's
  int lowest = fds[0];
  for (int i = 1; i < n; ++i) lowest = std::min(lowest, fds[i]);
  // Where the program's own next descriptors go (ours took the lowest free
  // numbers a moment ago): they must not reach the zone soon.
  rlim_t base = limit - zone;
  if (static_cast<rlim_t>(lowest) + zone >= base) return false;
  return move_all(fds, n, static_cast<int>(base), limit, later);
}

}  // namespace

bool keep(int* fds, int n, int later) {
  int saved = errno;
  bool ok = n > 0;
  for (int i = 0; i < n; ++i) ok = ok && fds[i] >= 0;
  {
    // The limit is read under the lock too: another thread's raise in
    // progress is not the program's limit (put back, it would stay raised).
    std::lock_guard<std::mutex> lock(g_mu);
    rlimit lim{};
    ok = ok && getrlimit(RLIMIT_NOFILE, &lim) == 0;
    ok = ok && (move_above(fds, n, lim, later) || move_into_zone(fds, n, lim, later));
  }
  if (!ok) close_all(fds, n);
  for (int i = 0; ok && i < n; ++i) mark(fds[i]);
  errno = saved;
  return ok;
}

bool keep_above(UniqueFd& fd) {
  int saved = errno;
  int v = fd.release();
  bool ok = v >= 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    rlimit lim{};
    ok = ok && getrlimit(RLIMIT_NOFILE, &lim) == 0 && move_above(&v, 1, lim, 0);
  }
  if (!ok) close_all(&v, 1);
  if (ok) mark(v);
  fd.reset(v);
  errno = saved;
  return ok;
}

bool keep_for_thread(UniqueFd& fd, UniqueFd (*make)(), ThreadRange& range, bool* in_range) {
  *in_range = false;
  fd = make();
  if (fd && keep_above(fd)) return true;
  if (range.used.fetch_add(1, std::memory_order_relaxed) < ThreadRange::kMax) {
    fd = make();
    if (fd && keep(fd)) {
      *in_range = true;
      return true;
    }
  }
  range.used.fetch_sub(1, std::memory_order_relaxed);
  fd.reset();
  return false;
}

void hold_for_fork() { g_mu.lock(); }
void release_after_fork() { g_mu.unlock(); }

bool is_ours(int fd) {
  return g_ours.has(fd);
}

void adopt(int fd) { mark(fd); }

void disown(int fd) { g_ours.clear(fd); }

void close(int fd) {
  g_ours.clear(fd);
  sys::real().close(fd);
}

int for_each_gap(unsigned first, unsigned last, int (*fn)(unsigned, unsigned, void*), void* ctx) {
  unsigned stop = std::min(last, g_highest.load(std::memory_order_relaxed));
  unsigned from = first;
  for (unsigned fd = first; fd <= stop && fd < FdBitmap::kBits; ++fd) {
    if (fd % 64 == 0 && g_ours.word_empty(fd)) {
      fd += 63;  // a word with none of ours
      continue;
    }
    if (!is_ours(static_cast<int>(fd))) continue;
    if (fd > from) {
      int r = fn(from, fd - 1, ctx);
      if (r < 0) return r;
    }
    from = fd + 1;
  }
  if (from > last || from == 0) return 0;  // from == 0: wrapped past ~0U
  return fn(from, last, ctx);
}

Promise::Promise(int n) : n_(n) { g_promised.fetch_add(n, std::memory_order_relaxed); }

void Promise::reset() {
  if (n_ != 0) g_promised.fetch_sub(n_, std::memory_order_relaxed);
  n_ = 0;
}

}  // namespace rdmashim::fds
