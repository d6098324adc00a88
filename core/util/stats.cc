#include "util/stats.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "sys/sys.h"

namespace rdmashim::stats {
namespace {

// Counted here until the page exists (and if it cannot be made).
std::atomic<uint64_t> g_local[static_cast<int>(Outcome::kCount)];
std::atomic<Page*> g_page{nullptr};
int g_fd = -1;
std::mutex g_mu;

Page* page() {
  Page* p = g_page.load(std::memory_order_acquire);
  if (p) return p;
  std::lock_guard<std::mutex> lock(g_mu);
  if ((p = g_page.load(std::memory_order_relaxed))) return p;
  int saved = errno;
  int fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void* m = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, 4096) == 0) m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    if (fd >= 0) sys::real().close(fd);
    errno = saved;
    return nullptr;
  }
  sys::real().fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  p = new (m) Page();
  p->magic = kPageMagic;
  p->version = kPageVersion;
  p->pid = static_cast<int32_t>(getpid());
  for (int i = 0; i < static_cast<int>(Outcome::kCount); ++i) p->counts[i].store(g_local[i].load());
  g_fd = fd;
  g_page.store(p, std::memory_order_release);
  errno = saved;
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
    case Outcome::kCount: break;
  }
  return "?";
}

void count(Outcome o) {
  int i = static_cast<int>(o);
  Page* p = page();  // first, so a new page is seeded with the counts before this one
  g_local[i].fetch_add(1, std::memory_order_relaxed);
  if (p) p->counts[i].fetch_add(1, std::memory_order_relaxed);
}

uint64_t get(Outcome o) { return g_local[static_cast<int>(o)].load(std::memory_order_relaxed); }

void after_fork_child() {
  Page* p = g_page.exchange(nullptr, std::memory_order_acq_rel);
  if (p) munmap(p, 4096);
  if (g_fd >= 0) sys::real().close(g_fd);
  g_fd = -1;
  for (auto& c : g_local) c.store(0, std::memory_order_relaxed);
}

}  // namespace rdmashim::stats
