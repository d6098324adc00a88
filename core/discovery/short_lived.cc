#include "discovery/short_lived.h"

#include <netinet/in.h>

#include <atomic>
#include <cstring>

#include "util/config.h"

namespace rdmashim::discovery {
namespace {

struct Key {
  uint16_t family = 0;
  uint16_t port = 0;
  unsigned char addr[16] = {};
  bool operator==(const Key& o) const { return memcmp(this, &o, sizeof o) == 0; }
};

// Direct-mapped: a destination shares its slot with whatever hashes there,
// and a collision only costs the loser its streak (an upgrade it would have
// skipped), never a skip it should not have.
struct Slot {
  std::atomic<bool> busy{false};
  Key key;
  uint32_t streak = 0;       // +1 per short close (at most kShortMaxStreak), -kShortLongPenalty per long one
  uint64_t last_short = 0;   // now_ns() of the latest short close
};
constexpr unsigned kSlots = 64;
Slot g_slots[kSlots];

bool make_key(const sockaddr* peer, socklen_t len, Key* k) {
  if (!peer) return false;
  if (peer->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(peer);
    k->family = AF_INET;
    k->port = a->sin_port;
    memcpy(k->addr, &a->sin_addr, sizeof a->sin_addr);
    return true;
  }
  if (peer->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(peer);
    k->family = AF_INET6;
    k->port = a->sin6_port;
    memcpy(k->addr, &a->sin6_addr, sizeof a->sin6_addr);
    return true;
  }
  return false;
}

Slot& slot_of(const Key& k) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < sizeof k; ++i) h = (h ^ reinterpret_cast<const unsigned char*>(&k)[i]) * 1099511628211ull;
  return g_slots[h % kSlots];
}

// Never waits: a slot another thread holds (or a forked child inherited held)
// is simply not consulted.
class Claim {
 public:
  explicit Claim(Slot& s) : s_(s), owned_(!s.busy.exchange(true, std::memory_order_acquire)) {}
  ~Claim() {
    if (owned_) s_.busy.store(false, std::memory_order_release);
  }
  explicit operator bool() const { return owned_; }

 private:
  Slot& s_;
  bool owned_;
};

}  // namespace

bool skip_short(const sockaddr* peer, socklen_t len, uint64_t now) {
  Key k;
  if (config().short_conn_ms == 0 || !make_key(peer, len, &k)) return false;
  Slot& s = slot_of(k);
  Claim claim(s);
  return claim && s.key == k && s.streak >= kShortStreak && now - s.last_short < kShortMemoryNs;
}

void note_closed(const sockaddr* peer, socklen_t len, uint64_t connected_ns, uint64_t now) {
  Key k;
  if (config().short_conn_ms == 0 || !make_key(peer, len, &k)) return;
  bool is_short = now - connected_ns < uint64_t{config().short_conn_ms} * 1'000'000;
  Slot& s = slot_of(k);
  Claim claim(s);
  if (!claim) return;
  if (!(s.key == k)) {
    if (!is_short) return;  // nothing to remember: the default is to upgrade
    s.key = k;
    s.streak = 0;
  }
  if (!is_short) {
    // One late close on a loaded machine does not end a long streak (each
    // wrong upgrade costs ten plain connections there); two in a row do.
    s.streak = s.streak > kShortLongPenalty ? s.streak - kShortLongPenalty : 0;
    return;
  }
  // A streak that went quiet starts over: old shorts say little about now.
  if (s.streak > 0 && now - s.last_short >= kShortMemoryNs) s.streak = 0;
  if (s.streak < kShortMaxStreak) ++s.streak;
  s.last_short = now;
}

void forget_short_for_tests() {
  for (Slot& s : g_slots) {
    Claim claim(s);
    s.key = Key{};
    s.streak = 0;
    s.last_short = 0;
  }
}

}  // namespace rdmashim::discovery
