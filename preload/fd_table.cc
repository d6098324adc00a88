#include "fd_table.h"

#include <cstdlib>

#include "util/misc.h"

namespace rdmashim::preload {

namespace {
// Zero-initialized at load time, so hooks called from another library's
// constructor, before ours ran, find a valid (empty) table.
constinit FdTable g_table;
}  // namespace

FdTable& table() { return g_table; }

void unref(Entry* e) {
  if (e && e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete e;
}

Ref::~Ref() { unref(e_); }

Ref& Ref::operator=(Ref&& o) noexcept {
  if (this != &o) {
    unref(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

FdTable::Slot* FdTable::slot(int fd, bool create) {
  if (fd < 0 || fd >= kMaxFd) return nullptr;
  std::atomic<Slot*>& leaf = leaves_[fd >> kLeafBits];
  Slot* l = leaf.load(std::memory_order_acquire);
  if (!l && create) {
    // calloc, not new: zeroed atomics, and no exception can escape a hook.
    auto* fresh = static_cast<Slot*>(calloc(kLeafSize, sizeof(Slot)));
    if (!fresh) return nullptr;
    if (leaf.compare_exchange_strong(l, fresh, std::memory_order_acq_rel)) {
      l = fresh;
    } else {
      free(fresh);  // another thread won; l now holds its leaf
    }
  }
  return l ? &l[fd & (kLeafSize - 1)] : nullptr;
}

uintptr_t FdTable::lock(Slot& s) {
  for (;;) {
    uintptr_t v = s.load(std::memory_order_relaxed);
    if (!(v & 1) && s.compare_exchange_weak(v, v | 1, std::memory_order_acquire)) return v;
    cpu_relax();
  }
}

Ref FdTable::get(int fd) {
  Slot* s = slot(fd, false);
  if (!s || s->load(std::memory_order_relaxed) == 0) return Ref();  // the untracked fast path
  uintptr_t v = lock(*s);
  auto* e = reinterpret_cast<Entry*>(v);
  if (e) e->refs.fetch_add(1, std::memory_order_relaxed);
  s->store(v, std::memory_order_release);
  return Ref(e);
}

bool FdTable::set(int fd, Entry* e) {
  Slot* s = slot(fd, true);
  if (!s) return false;
  e->refs.fetch_add(1, std::memory_order_relaxed);
  uintptr_t old = lock(*s);
  s->store(reinterpret_cast<uintptr_t>(e), std::memory_order_release);
  unref(reinterpret_cast<Entry*>(old));  // a stale entry for a reused number
  return true;
}

Entry* FdTable::take(int fd) {
  Slot* s = slot(fd, false);
  if (!s || s->load(std::memory_order_relaxed) == 0) return nullptr;
  uintptr_t old = lock(*s);
  s->store(0, std::memory_order_release);
  return reinterpret_cast<Entry*>(old);
}

void FdTable::reset_locks_after_fork() {
  for (auto& leaf : leaves_) {
    Slot* l = leaf.load(std::memory_order_relaxed);
    if (!l) continue;
    for (int i = 0; i < kLeafSize; ++i) l[i].fetch_and(~uintptr_t{1}, std::memory_order_relaxed);
  }
}

}  // namespace rdmashim::preload
