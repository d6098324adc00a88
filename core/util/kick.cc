#include "util/kick.h"

#include <sys/eventfd.h>

#include <cstdint>

#include "sys/sys.h"
#include "util/fd_budget.h"
#include "util/process.h"

namespace rdmashim {

namespace {
// Threads' kicks in the program's range, process-wide (as conn/thread_epoll.cc).
constexpr int kMaxThreadsInRange = 4;
std::atomic<int> g_threads_in_range{0};

UniqueFd new_eventfd() { return UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)); }
}  // namespace

std::shared_ptr<Kick> Kick::make(Owner owner) {
  if (sandbox() != Sandbox::kNone) return nullptr;
  auto k = std::make_shared<Kick>();
  k->fd_ = new_eventfd();
  if (!k->fd_) return nullptr;
  if (owner == Owner::kEpollSet) return fds::keep(k->fd_) ? k : nullptr;
  if (fds::keep_above(k->fd_)) return k;
  if (g_threads_in_range.fetch_add(1, std::memory_order_relaxed) < kMaxThreadsInRange) {
    k->in_range_ = true;  // from here the destructor gives the slot back
    k->generation_ = fork_generation();
    k->fd_ = new_eventfd();
    if (k->fd_ && fds::keep(k->fd_)) return k;
    return nullptr;
  }
  g_threads_in_range.fetch_sub(1, std::memory_order_relaxed);
  return nullptr;
}

Kick::~Kick() {
  if (in_range_ && generation_ == fork_generation()) g_threads_in_range.fetch_sub(1, std::memory_order_relaxed);
}

void Kick::after_fork_child() { g_threads_in_range.store(0, std::memory_order_relaxed); }

void Kick::ring() {
  if (asleep_.load(std::memory_order_seq_cst) <= 0) return;
  uint64_t one = 1;
  (void)sys::real().write(fd_.get(), &one, sizeof one);
}

void Kick::drain() {
  uint64_t n;
  (void)sys::real().read(fd_.get(), &n, sizeof n);
}

}  // namespace rdmashim
