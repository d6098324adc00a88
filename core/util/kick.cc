#include "util/kick.h"

#include <sys/eventfd.h>

#include <cstdint>

#include "sys/sys.h"
#include "util/fd_budget.h"
#include "util/process.h"

namespace rdmashim {

namespace {
fds::ThreadRange g_threads_in_range;  // threads' kicks in the program's range

UniqueFd new_eventfd() { return UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)); }
}  // namespace

std::shared_ptr<Kick> Kick::make(Owner owner) {
  if (sandbox() != Sandbox::kNone) return nullptr;
  auto k = std::make_shared<Kick>();
  if (owner == Owner::kEpollSet) {
    k->fd_ = new_eventfd();
    return k->fd_ && fds::keep(k->fd_) ? k : nullptr;
  }
  if (!fds::keep_for_thread(k->fd_, new_eventfd, g_threads_in_range, &k->in_range_)) return nullptr;
  k->generation_ = fork_generation();
  return k;
}

Kick::~Kick() {
  if (in_range_ && generation_ == fork_generation()) g_threads_in_range.used.fetch_sub(1, std::memory_order_relaxed);
}

void Kick::after_fork_child() { g_threads_in_range.used.store(0, std::memory_order_relaxed); }

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
