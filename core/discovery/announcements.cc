#include "discovery/announcements.h"

#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "sys/sys.h"
#include "util/misc.h"

namespace rdmashim::discovery {
namespace {

std::atomic<AnnouncementTable*> g_table{nullptr};

bool same_addr(const AnnounceKey& a, const AnnounceKey& b) { return memcmp(a.addr, b.addr, sizeof a.addr) == 0; }

}  // namespace

bool announce_key(const sockaddr* sa, socklen_t len, AnnounceKey* out) {
  *out = {};
  if (sa && sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    out->addr[10] = out->addr[11] = 0xff;
    memcpy(out->addr + 12, &in->sin_addr, 4);
    out->port = ntohs(in->sin_port);
    return true;
  }
  if (sa && sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    memcpy(out->addr, &in6->sin6_addr, 16);
    out->port = ntohs(in6->sin6_port);
    return true;
  }
  return false;
}

// The word holds the holder's pid: a holder killed mid-scan is noticed and
// its lock taken over; a live one (descheduled on a busy machine) is waited
// for, up to kLockWaitNs, after which the caller does without.
bool AnnouncementTable::lock() {
  constexpr uint64_t kLockWaitNs = 50'000'000;
  const uint32_t me = static_cast<uint32_t>(getpid());
  uint64_t give_up = 0;
  for (int spins = 0;; spins++) {
    uint32_t holder = 0;
    if (lock_.compare_exchange_weak(holder, me, std::memory_order_acquire, std::memory_order_relaxed)) return true;
    if (spins < 64) {
      cpu_relax();
      continue;
    }
    if (holder != 0 && holder != me && kill(static_cast<pid_t>(holder), 0) != 0 && errno == ESRCH &&
        lock_.compare_exchange_strong(holder, me, std::memory_order_acquire, std::memory_order_relaxed)) {
      return true;  // its holder died inside a scan of a few slots: nothing half-written matters here
    }
    uint64_t now = now_ns();
    if (give_up == 0) give_up = now + kLockWaitNs;
    if (now >= give_up) return false;
    if (spins < 256) sched_yield();
    else usleep(100);
  }
}

bool AnnouncementTable::record(const AnnounceKey& client, const uint8_t nonce[16], uint64_t now, uint64_t ttl) {
  if (!lock()) return false;
  Slot* free = nullptr;
  size_t from_client = 0;
  bool again = false;
  for (Slot& s : slots_) {
    if (s.expires_ns != 0 && s.expires_ns <= now) s.expires_ns = 0;
    if (s.expires_ns == 0) {
      if (!free) free = &s;
      continue;
    }
    if (same_addr(s.key, client)) from_client++;
    if (memcmp(s.nonce, nonce, sizeof s.nonce) == 0) again = true;
  }
  bool ok = free && !again && from_client < kPerAddress;
  if (ok) {
    free->key = client;
    memcpy(free->nonce, nonce, sizeof free->nonce);
    free->expires_ns = now + ttl;
  }
  unlock();
  return ok;
}

bool AnnouncementTable::pending(const AnnounceKey& client, uint64_t now) {
  if (!lock()) return false;
  bool found = false;
  for (const Slot& s : slots_) {
    if (s.expires_ns > now && s.key.port == client.port && same_addr(s.key, client)) {
      found = true;
      break;
    }
  }
  unlock();
  return found;
}

bool AnnouncementTable::consume(const uint8_t nonce[16]) {
  if (!lock()) return false;
  bool found = false;
  for (Slot& s : slots_) {
    if (s.expires_ns != 0 && memcmp(s.nonce, nonce, sizeof s.nonce) == 0) {
      s.expires_ns = 0;
      found = true;
      break;
    }
  }
  unlock();
  return found;
}

size_t AnnouncementTable::size(uint64_t now) {
  if (!lock()) return 0;
  size_t n = 0;
  for (const Slot& s : slots_) n += s.expires_ns > now;
  unlock();
  return n;
}

AnnouncementTable* announcements() { return g_table.load(std::memory_order_acquire); }

AnnouncementTable* create_announcements() {
  if (AnnouncementTable* t = announcements()) return t;
  void* p = mmap(nullptr, sizeof(AnnouncementTable), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* t = new (p) AnnouncementTable();
  AnnouncementTable* none = nullptr;
  if (!g_table.compare_exchange_strong(none, t, std::memory_order_acq_rel)) {
    munmap(p, sizeof(AnnouncementTable));  // another thread made it first
    return none;
  }
  return t;
}

bool remote_client_announced(int fd) {
  AnnouncementTable* t = announcements();
  if (!t) return false;
  sockaddr_storage peer{}, local{};
  socklen_t plen = sizeof peer, llen = sizeof local;
  AnnounceKey key, here;
  if (sys::real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 ||
      sys::real().getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      !announce_key(reinterpret_cast<sockaddr*>(&peer), plen, &key) ||
      !announce_key(reinterpret_cast<sockaddr*>(&local), llen, &here)) {
    return false;
  }
  key.port = here.port;  // announced to the listening port
  return t->pending(key, now_ns());
}

void remote_hello_arrived(const uint8_t nonce[16]) {
  if (AnnouncementTable* t = announcements()) t->consume(nonce);
}

}  // namespace rdmashim::discovery
