#include "shm/shm_link.h"

#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "sys/sys.h"
#include "util/process.h"

namespace rdmashim::shm {
namespace {

uint64_t next_key() {
  static std::atomic<uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

// Rings one drain reads at most (one recvmmsg).
constexpr unsigned kDrainBatch = 32;

// How many rings an edge-triggered sleeper may leave queued. Each is a
// datagram charged to the peer's send buffer until we read it; were the
// buffer full, the peer's write would fail with EAGAIN (which it takes for
// "a wake is pending") and an edge-triggered sleeper would never wake. A
// one-byte datagram takes 768 bytes of it (278 fill the default 208 KiB,
// net.core.wmem_default), so one per 3 KiB of our own buffer (the peer's
// has the same defaults) keeps a margin of four; at most one batch, so a
// poll() sleeper that finds them drains them in one call.
int64_t rings_left_queued(int doorbell) {
  static const int64_t allowed = [doorbell] {
    int sndbuf = 0;
    socklen_t len = sizeof sndbuf;
    if (sys::real().getsockopt(doorbell, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) != 0) return int64_t{0};
    return std::min<int64_t>(kDrainBatch - 1, sndbuf / 3072);
  }();
  return allowed;
}

}  // namespace

ShmLink::ShmLink(std::unique_ptr<Segment> segment, std::unique_ptr<LocalPage> local, UniqueFd doorbell, Side self)
    : segment_(std::move(segment)),
      local_(std::move(local)),
      doorbell_(std::move(doorbell)),
      key_(next_key()),
      self_(self),
      peer_(self == kClient ? kServer : kClient),
      mine_(segment_->header()->side[self_]),
      theirs_(segment_->header()->side[peer_]),
      tx_(segment_->rx_ring(peer_)),
      rx_(segment_->rx_ring(self_)) {}

void ShmLink::put(uint64_t offset, const void* src, size_t len) { memcpy(tx_ + offset, src, len); }

// Publishing and sleeping form a Dekker pair: each side stores, fences, then
// loads the other's word, so either the publisher sees the sleeper or the
// sleeper's re-check sees the data. Never both missed.
void ShmLink::publish_tail(uint64_t tail) {
  local().produced.store(tail, std::memory_order_relaxed);
  mine_.produced.value.store(tail, std::memory_order_release);
  wake_peer(kDataSleepers);
}

void ShmLink::publish_head(uint64_t head) {
  local().consumed.store(head, std::memory_order_relaxed);
  mine_.consumed.value.store(head, std::memory_order_release);
  wake_peer(kSpaceSleepers);
}

// A peer waiting for the other direction is not woken: it would find
// nothing, sleep again, and cost two context switches for nothing. Nor is a
// sleep rung twice: the first datagram wakes it, more would only queue.
// The word is the peer's: whatever it says costs us one write that cannot
// block (our socket, O_NONBLOCK; EAGAIN means the peer has wakes queued).
void ShmLink::wake_peer(uint64_t who) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint64_t word = theirs_.sleepers.load(std::memory_order_relaxed);
  if ((word & who) == 0) return;
  uint32_t sleep = static_cast<uint32_t>(word >> 32);
  if (rung_sleep_.exchange(sleep, std::memory_order_relaxed) == sleep) return;
  unsigned char one = 1;
  if (sys::real().write(doorbell_.get(), &one, 1) == 1) mine_.rings.fetch_add(1, std::memory_order_relaxed);
}

uint64_t ShmLink::peer_head() { return theirs_.consumed.value.load(std::memory_order_acquire); }
uint64_t ShmLink::peer_tail() { return theirs_.produced.value.load(std::memory_order_acquire); }

namespace {
uint32_t sleeper_units(unsigned what) {
  return ((what & Link::kWaitData) ? 1u : 0u) + ((what & Link::kWaitSpace) ? 1u << 16 : 0u);
}
}  // namespace

// The segment's word tells the peer to ring; our own count (LocalState,
// which the peer cannot write) decides who drains.
void ShmLink::prepare_sleep(unsigned what) {
  uint32_t units = sleeper_units(what);
  local().sleepers.fetch_add(units, std::memory_order_relaxed);
  mine_.sleepers.fetch_add(units + kOneSleep, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

bool ShmLink::last_out(unsigned what) {
  uint32_t units = sleeper_units(what);
  mine_.sleepers.fetch_sub(units, std::memory_order_relaxed);
  return local().sleepers.fetch_sub(units, std::memory_order_relaxed) == units;
}

void ShmLink::finish_sleep(unsigned what, bool rung) { settle(last_out(what), rung, false); }
void ShmLink::finish_edge_sleep(unsigned what) { settle(last_out(what), false, true); }

// Who drains the doorbell. Its queue is what wakes a poll() sleeper, and an
// edge-triggered one's epoll_wait reports an edge only if the doorbell is
// still readable when it collects it; a full queue (the peer's send buffer)
// would turn the peer's next ring into EAGAIN, and we would never wake.
//  - The last sleeper out reads the ring it saw and every one the peer
//    counted; one that slept edge-triggered (woken by each new ring, queued
//    ones or not) lets up to rings_left_queued() pile up first.
//  - A sleeper that leaves others asleep reads nothing while few are
//    queued: what they are owed must stay readable. Past that it reads all
//    but the newest, so that a thread asleep all through a long transfer
//    (a reader waiting for the next request while its writer thread sleeps
//    for credit again and again) does not let the other's rings fill it.
void ShmLink::settle(bool last, bool rung, bool edge) {
  const bool sandboxed = sandbox() != Sandbox::kNone;
  int64_t owed = static_cast<int64_t>(theirs_.rings.load(std::memory_order_relaxed) -
                                      local().drained.load(std::memory_order_relaxed));
  if (last && (!edge || sandboxed)) {
    drain(owed > 0 ? static_cast<uint64_t>(owed) : rung ? 1 : 0);
    return;
  }
  // Under a seccomp filter without asking the kernel (getsockopt may be refused).
  int64_t allowed = sandboxed ? 8 : rings_left_queued(doorbell_.get());
  if (owed > allowed) drain(static_cast<uint64_t>(last ? owed : owed - 1));
}

// Reads up to `rings` datagrams, one each: recvmmsg takes a batch in one
// call where no seccomp filter may refuse it. The count is the peer's, so
// untrusted: reading stops at an empty queue.
void ShmLink::drain(uint64_t rings) {
  unsigned char byte;  // a ring is one byte; all of them land here
  for (int round = 0; rings > 0 && round < 4; ++round) {
    unsigned want = rings < kDrainBatch ? static_cast<unsigned>(rings) : kDrainBatch;
    int got = 0;
    if (want > 1 && sandbox() == Sandbox::kNone) {
      iovec iov{&byte, 1};
      mmsghdr m[kDrainBatch]{};
      for (unsigned i = 0; i < want; ++i) {
        m[i].msg_hdr.msg_iov = &iov;
        m[i].msg_hdr.msg_iovlen = 1;
      }
      got = sys::real().recvmmsg(doorbell_.get(), m, want, MSG_DONTWAIT, nullptr);
    } else {
      for (; static_cast<unsigned>(got) < want && got < 8; ++got) {
        if (sys::real().read(doorbell_.get(), &byte, 1) < 0) break;  // one datagram: one ring
      }
    }
    if (got <= 0) return;
    local().drained.fetch_add(static_cast<uint64_t>(got), std::memory_order_relaxed);
    if (static_cast<unsigned>(got) < want) return;
    rings -= static_cast<unsigned>(got);
  }
}

// MADV_REMOVE on our shared writable mapping frees the memfd's pages (in
// both processes; a later write gets a fresh zero page), as a hole punch
// would, and works under the F_SEAL_SHRINK | F_SEAL_GROW seals. madvise is
// a call most sandboxes allow (malloc makes it), but not with every advice
// (OpenSSH's filter fails MADV_REMOVE, stricter ones kill): under a seccomp
// filter the pages stay; should the kernel refuse anyway, we stop asking.
bool ShmLink::punch(unsigned char* ring, size_t len) {
  static std::atomic<bool> refused{false};
  if (len == 0 || refused.load(std::memory_order_relaxed) || sandbox() != Sandbox::kNone) return false;
  if (madvise(ring, len, MADV_REMOVE) == 0) return true;
  refused.store(true, std::memory_order_relaxed);
  return false;
}

void ShmLink::mark_attached() { mine_.attached.store(1, std::memory_order_release); }
bool ShmLink::peer_attached() const { return theirs_.attached.load(std::memory_order_acquire) != 0; }

bool ShmLink::waits_beside_peer(int cpu) {
  if (cpu < 0) return false;
  const int32_t tag = cpu + 1;
  // Written only when it changes: the peer reads this line as it spins.
  if (mine_.cpu.load(std::memory_order_relaxed) != tag) mine_.cpu.store(tag, std::memory_order_relaxed);
  return theirs_.cpu.load(std::memory_order_relaxed) == tag;
}

}  // namespace rdmashim::shm
