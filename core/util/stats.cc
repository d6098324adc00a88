#include "util/stats.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>

#include "sys/sys.h"
#include "util/fd_budget.h"

namespace rdmashim::stats {
namespace {

// Counted here until the page exists (and if it cannot be made).
std::atomic<uint64_t> g_local[static_cast<int>(Outcome::kCount)];
std::atomic<Page*> g_page{nullptr};
std::mutex g_verbs_mu;  // orders the copies into the page
VerbsResources g_verbs;    // under g_verbs_mu

void store_verbs(Page* p, const VerbsResources& r) {
  p->verbs_registered.store(static_cast<uint64_t>(r.registered), std::memory_order_relaxed);
  p->verbs_pooled.store(static_cast<uint64_t>(r.pooled), std::memory_order_relaxed);
  p->verbs_qps.store(static_cast<uint64_t>(r.qps), std::memory_order_relaxed);
  p->verbs_cqs.store(static_cast<uint64_t>(r.cqs), std::memory_order_relaxed);
  p->verbs_mrs.store(static_cast<uint64_t>(r.mrs), std::memory_order_relaxed);
  p->verbs_beats.store(static_cast<uint64_t>(r.beats), std::memory_order_relaxed);
}
int g_fd = -1;
std::mutex g_mu;  // page creation, and taking or giving back a row

// A new sealed memfd of kPageBytes, mapped at `at` (MAP_FIXED) or anywhere.
void* map_new(int* fd_out, void* at) {
  int fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd >= 0 && !fds::keep(&fd, 1)) return nullptr;  // out of the program's numbers
  void* m = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, kPageBytes) == 0) {
    m = mmap(at, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);
  }
  if (m == MAP_FAILED) {
    if (fd >= 0) fds::close(fd);
    return nullptr;
  }
  sys::real().fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  *fd_out = fd;
  return m;
}

// g_verbs_mu held: a set_verbs() is either copied here or writes the page itself.
void stamp(Page* p) {
  p->magic = kPageMagic;
  p->version = kPageVersion;
  p->pid = static_cast<int32_t>(getpid());
  p->slots = kSlots;
  for (int i = 0; i < kOutcomes; ++i) p->count_of(i).store(g_local[i].load());
  store_verbs(p, g_verbs);  // g_verbs_mu held
}

Page* page() {
  Page* p = g_page.load(std::memory_order_acquire);
  if (p) return p;
  std::lock_guard<std::mutex> lock(g_mu);
  if ((p = g_page.load(std::memory_order_relaxed))) return p;
  int saved = errno;
  void* m = map_new(&g_fd, nullptr);
  errno = saved;
  if (!m) return nullptr;
  p = new (m) Page();
  std::lock_guard<std::mutex> verbs(g_verbs_mu);
  stamp(p);
  g_page.store(p, std::memory_order_release);
  return p;
}

}  // namespace

const char* name(Outcome o) {
  switch (o) {
    case Outcome::kShm: return "shm";
    case Outcome::kVerbs: return "verbs";
    case Outcome::kTcpNotAdvertised: return "tcp:not-advertised";
    case Outcome::kTcpPeerPlain: return "tcp:peer-plain";
    case Outcome::kTcpServerSpokeFirst: return "tcp:server-spoke-first";
    case Outcome::kTcpSetupFailed: return "tcp:setup-failed";
    case Outcome::kTcpTimeout: return "tcp:timeout";
    case Outcome::kTcpPolicy: return "tcp:policy";
    case Outcome::kTcpFdBudget: return "tcp:fd-budget";
    case Outcome::kTcpVerbsLimit: return "tcp:verbs-limit";
    case Outcome::kCount: break;
  }
  return "?";
}

void count(Outcome o) {
  int i = static_cast<int>(o);
  Page* p = page();  // first, so a new page is seeded with the counts before this one
  g_local[i].fetch_add(1, std::memory_order_relaxed);
  if (p) p->count_of(i).fetch_add(1, std::memory_order_relaxed);
}

void uncount(Outcome o) {
  int i = static_cast<int>(o);
  // Not below 0: a child after fork starts its counts anew (after_fork_child).
  if (g_local[i].load(std::memory_order_relaxed) == 0) return;
  g_local[i].fetch_sub(1, std::memory_order_relaxed);
  if (Page* p = g_page.load(std::memory_order_relaxed)) p->count_of(i).fetch_sub(1, std::memory_order_relaxed);
}

void verbs_add(const VerbsResources& d) {
  std::lock_guard<std::mutex> lock(g_verbs_mu);
  g_verbs.registered += d.registered, g_verbs.pooled += d.pooled;
  g_verbs.qps += d.qps, g_verbs.cqs += d.cqs, g_verbs.mrs += d.mrs;
  g_verbs.beats += d.beats;
  if (Page* p = g_page.load(std::memory_order_acquire)) store_verbs(p, g_verbs);
}

VerbsResources verbs_resources() {
  std::lock_guard<std::mutex> lock(g_verbs_mu);
  return g_verbs;
}

void verbs_reset() {
  // Only this thread exists now. The page may still be the parent's (the
  // atfork handlers run in any order): after_fork_child stamps ours.
  new (&g_verbs_mu) std::mutex();
  g_verbs = VerbsResources{};
}

uint64_t get(Outcome o) { return g_local[static_cast<int>(o)].load(std::memory_order_relaxed); }

void after_fork_child() {
  new (&g_mu) std::mutex();  // another thread of the parent may have held it
  verbs_reset();
  for (auto& c : g_local) c.store(0, std::memory_order_relaxed);
  Page* p = g_page.load(std::memory_order_relaxed);
  if (!p) return;
  // The rows of the connections we inherited stay at the same address (their
  // Row points there): a copy of the page goes over the parent's mapping.
  int saved = errno;
  void* copy = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy != MAP_FAILED) memcpy(copy, p, kPageBytes);
  int old_fd = g_fd;
  g_fd = -1;
  if (copy == MAP_FAILED || !map_new(&g_fd, p)) {
    // Rows must not write the parent's page: they write a private one nobody reads.
    g_page.store(nullptr, std::memory_order_relaxed);
    mmap(p, kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  } else {
    memcpy(static_cast<void*>(p), copy, kPageBytes);
    std::lock_guard<std::mutex> verbs(g_verbs_mu);
    stamp(p);
    for (Slot& s : p->slot) {
      for (auto* c : {&s.tx_bytes, &s.tx_msgs, &s.rx_bytes, &s.rx_msgs}) c->store(0, std::memory_order_relaxed);
      // A row another thread was filling at fork: nobody here will finish it.
      uint32_t seq = s.seq.load(std::memory_order_relaxed);
      if (seq % 4 == 1) s.seq.store(seq + 3, std::memory_order_relaxed);
    }
  }
  if (copy != MAP_FAILED) munmap(copy, kPageBytes);
  if (old_fd >= 0) fds::close(old_fd);
  errno = saved;
}

void Row::open(int fd, Outcome o, bool server, uint64_t ring_bytes) {
  if (slot_ || unlisted_) return;
  Page* p = page();
  if (!p) return;
  Slot* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (Slot& c : p->slot) {
      uint32_t seq = c.seq.load(std::memory_order_relaxed);
      if (seq % 4 == 0) {
        s = &c;
        s->seq.store(seq + 1, std::memory_order_relaxed);
        break;
      }
    }
  }
  if (!s) {
    unlisted_ = true;
    p->unlisted.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::atomic_thread_fence(std::memory_order_release);
  int saved = errno;
  s->outcome = static_cast<int32_t>(o);
  s->fd = fd;
  s->role = server ? 1 : 0;
  s->ring_bytes = ring_bytes;
  s->downgraded[0] = 0;
  s->inode = 0;
  memset(&s->local, 0, sizeof s->local);
  memset(&s->peer, 0, sizeof s->peer);
  if (o == Outcome::kShm || o == Outcome::kVerbs) {
    // A TCP row is left to the reader (the fd's /proc link, sock_diag): a
    // connection that stays plain pays no system call for its row.
    struct stat st{};
    s->inode = fstat(fd, &st) == 0 ? st.st_ino : 0;
    socklen_t len = sizeof s->local;
    sys::real().getsockname(fd, reinterpret_cast<sockaddr*>(&s->local), &len);
    len = sizeof s->peer;
    sys::real().getpeername(fd, reinterpret_cast<sockaddr*>(&s->peer), &len);
  }
  std::atomic<uint64_t>* row = &s->tx_bytes;
  for (int i = 0; i < kCounters; ++i) row[i].store(own_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  ctr_.store(row, std::memory_order_relaxed);
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  s->opened_ns = static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
  errno = saved;
  s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  slot_ = s;
}

void Row::downgraded(const char* reason) {
  if (!slot_) return;
  // Out of the live state while the text changes (readers retry or skip).
  uint32_t seq = slot_->seq.load(std::memory_order_relaxed);
  slot_->seq.store(seq - 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  size_t n = strnlen(reason, sizeof slot_->downgraded - 1);
  memcpy(slot_->downgraded, reason, n);
  slot_->downgraded[n] = 0;
  slot_->seq.store(seq, std::memory_order_release);
}

void Row::close() {
  if (unlisted_) {
    if (Page* p = g_page.load(std::memory_order_relaxed)) p->unlisted.fetch_sub(1, std::memory_order_relaxed);
    unlisted_ = false;
  }
  if (!slot_) return;
  ctr_.store(own_, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_page.load(std::memory_order_relaxed)) slot_->seq.fetch_add(2, std::memory_order_release);
  slot_ = nullptr;
}

}  // namespace rdmashim::stats
