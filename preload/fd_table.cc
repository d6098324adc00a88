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
  if (Slot* s = find(leaves_, fd); s || !create || static_cast<unsigned>(fd) >= static_cast<unsigned>(kMaxFd)) return s;
  std::atomic<Slot*>& leaf = leaves_[fd >> kLeafBits];
  // calloc, not new: zeroed atomics, and no exception can escape a hook.
  auto* fresh = static_cast<Slot*>(calloc(kLeafSize, sizeof(Slot)));
  if (!fresh) return nullptr;
  Slot* l = nullptr;
  if (leaf.compare_exchange_strong(l, fresh, std::memory_order_acq_rel)) {
    l = fresh;
  } else {
    free(fresh);  // another thread won; l now holds its leaf
  }
  return &l[fd & (kLeafSize - 1)];
}

uintptr_t FdTable::lock(Slot& s) {
  for (;;) {
    uintptr_t v = s.load(std::memory_order_relaxed);
    if (!(v & kLockBit) && s.compare_exchange_weak(v, v | kLockBit, std::memory_order_acquire)) return v;
    cpu_relax();
  }
}

Ref FdTable::get_locked(Slot& s) {
  uintptr_t v = lock(s);
  auto* e = reinterpret_cast<Entry*>(v & ~kFlagBits);
  if (e) e->refs.fetch_add(1, std::memory_order_relaxed);
  s.store(v, std::memory_order_release);  // the plain mark stays as it was
  return Ref(e);
}

void FdTable::mark_plain(int fd, const Entry* e) {
  Slot* s = find(leaves_, fd);
  uintptr_t v = reinterpret_cast<uintptr_t>(e);
  // Only the same entry, unlocked and unmarked; a busy slot is marked next time.
  if (s && e) s->compare_exchange_strong(v, v | kPlainBit, std::memory_order_relaxed);
}

bool FdTable::set(int fd, Entry* e) {
  Slot* s = slot(fd, true);
  if (!s) return false;
  e->refs.fetch_add(1, std::memory_order_relaxed);
  uintptr_t old = lock(*s);
  s->store(reinterpret_cast<uintptr_t>(e), std::memory_order_release);
  unref(reinterpret_cast<Entry*>(old & ~kFlagBits));  // a stale entry for a reused number
  return true;
}

Entry* FdTable::take(int fd) {
  Slot* s = find(leaves_, fd);
  if (!s || s->load(std::memory_order_relaxed) == 0) return nullptr;
  uintptr_t old = lock(*s);
  s->store(0, std::memory_order_release);
  return reinterpret_cast<Entry*>(old & ~kFlagBits);
}

void FdTable::reset_locks_after_fork() {
  for (auto& leaf : leaves_) {
    Slot* l = leaf.load(std::memory_order_relaxed);
    if (!l) continue;
    for (int i = 0; i < kLeafSize; ++i) l[i].fetch_and(~kLockBit, std::memory_order_relaxed);
  }
}

}  // namespace rdmashim::preload
