// Deadlines and timeouts shared by the poll and epoll hooks (wait_common.h).
#include "wait_common.h"

#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

namespace rdmashim::preload {

int64_t deadline_from_ms(int ms) { return ms < 0 ? kForever : static_cast<int64_t>(now_ns()) + ms * 1'000'000LL; }
int64_t deadline_from_ts(const timespec* ts) {
  return ts ? static_cast<int64_t>(now_ns()) + ts->tv_sec * 1'000'000'000LL + ts->tv_nsec : kForever;
}
bool expired(int64_t dl) { return dl != kForever && static_cast<int64_t>(now_ns()) >= dl; }
int ms_left(int64_t dl) {
  if (dl == kForever) return -1;
  int64_t left = dl - static_cast<int64_t>(now_ns());
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>((left + 999'999) / 1'000'000, INT32_MAX));
}
timespec ts_left(int64_t dl) {
  int64_t left = std::max<int64_t>(0, dl - static_cast<int64_t>(now_ns()));
  return timespec{static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
}

int64_t release_before_sleep(int64_t dl) {
  uint64_t due = Connection::release_idle_memory(nullptr);
  if (due == 0) return dl;
  return dl == kForever || static_cast<int64_t>(due) < dl ? static_cast<int64_t>(due) : dl;
}

bool bad_timespec(const timespec* ts) {
  return ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1'000'000'000);
}

namespace {
// Kicks of threads that exited, for the next threads to take: a server that
// starts a thread per connection makes a few, not one (and its system
// calls) per connection. Never destroyed: a thread may exit after the
// static destructors ran.
struct KickPool {
  std::mutex mu;
  std::vector<std::shared_ptr<Kick>> free;
};
KickPool& kick_pool() {
  static KickPool* pool = new KickPool;
  return *pool;
}

struct ThreadKick {
  std::shared_ptr<Kick> kick;
  bool refused = false;
  ~ThreadKick() {
    if (!kick) return;
    KickPool& pool = kick_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.free.push_back(std::move(kick));
  }
};
thread_local ThreadKick t_kick;
}  // namespace

std::shared_ptr<Kick> thread_kick() {
  if (!t_kick.kick && !t_kick.refused) {
    {
      KickPool& pool = kick_pool();
      std::lock_guard<std::mutex> lock(pool.mu);
      if (!pool.free.empty()) {
        t_kick.kick = std::move(pool.free.back());
        pool.free.pop_back();
      }
    }
    if (!t_kick.kick) t_kick.kick = Kick::make(Kick::Owner::kThread);
    t_kick.refused = !t_kick.kick;
  }
  return t_kick.kick;
}

void hold_kicks_for_fork() { kick_pool().mu.lock(); }
void release_kicks_after_fork(bool child) {
  KickPool& pool = kick_pool();
  if (child) {
    // The parent's descriptors: a level-triggered kick drained by one of
    // the two processes would be missed by the other.
    pool.free.clear();
    t_kick.kick.reset();
    t_kick.refused = false;
    Kick::after_fork_child();
  }
  pool.mu.unlock();
}

}  // namespace rdmashim::preload
