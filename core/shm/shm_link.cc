#include "shm/shm_link.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <cstring>

#include "sys/sys.h"
#include "util/fd_budget.h"
#include "util/process.h"

namespace rdmashim::shm {

ShmLink::ShmLink(std::unique_ptr<Segment> segment, std::unique_ptr<LocalPage> local, UniqueFd doorbell, Side self)
    : segment_(std::move(segment)),
      local_(std::move(local)),
      doorbell_(std::move(doorbell)),
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

void ShmLink::finish(unsigned what, bool rung, bool edge) {
  // The last sleeper out drains the doorbell: the ring it saw, and any the
  // peer counted while it slept (read before leaving: a ring counted after
  // may be a later sleeper's). Earlier ones leave it readable so a thread
  // still about to sleep cannot miss the wakeup it is owed. After an
  // edge-triggered sleep a queued ring wakes no later such sleep: the rings
  // stay until kLazyDrain are owed, marked stale for level-triggered
  // sleepers (drop_stale).
  uint32_t units = sleeper_units(what);
  uint64_t rings = theirs_.rings.load(std::memory_order_relaxed);
  mine_.sleepers.fetch_sub(units, std::memory_order_relaxed);
  if (local().sleepers.fetch_sub(units, std::memory_order_relaxed) != units) return;
  std::lock_guard<std::mutex> lock(drain_mu_);
  int64_t owed = static_cast<int64_t>(rings - local().drained.load(std::memory_order_relaxed));
  if (edge && owed < lazy_drain()) {
    if (owed > 0 && static_cast<int64_t>(rings - local().stale_upto.load(std::memory_order_relaxed)) > 0)
      local().stale_upto.store(rings, std::memory_order_relaxed);
    return;
  }
  if (owed <= 0 && !rung) return;
  drain(owed > 0 ? owed : 1, rings);
}

// Once per process, from the first doorbell: our SO_SNDBUF stands for the
// peer's (same host, same defaults; a peer that shrinks its own only loses
// its own rings). In a sandbox no call of ours: drain every ring.
int64_t ShmLink::lazy_drain() const {
  if (sandbox() != Sandbox::kNone) return 1;
  static const int64_t n = [fd = doorbell_.get()] {
    int sndbuf = 0;
    socklen_t len = sizeof sndbuf;
    if (sys::real().getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len) != 0) return int64_t{1};
    int64_t quarter = sndbuf / kBytesPerRing / 4;
    return quarter < 1 ? int64_t{1} : quarter > kLazyDrain ? kLazyDrain : quarter;
  }();
  return n;
}

void ShmLink::drop_stale() {
  std::lock_guard<std::mutex> lock(drain_mu_);
  uint64_t upto = local().stale_upto.load(std::memory_order_relaxed);
  int64_t n = static_cast<int64_t>(upto - local().drained.load(std::memory_order_relaxed));
  if (n > 0) drain(n, upto);
}

// Reads up to n rings (one datagram each; n comes from the peer's count, so
// it is capped), in one recvmmsg where allowed, else one read each; drain_mu_
// held. A queue found empty means every ring counted up to `rings` was read:
// a peer that counts rings it never sent costs one such call, then no more.
void ShmLink::drain(int64_t n, uint64_t rings) {
  constexpr int kBatch = 64;
  if (n > 4 * kBatch) n = 4 * kBatch;
  while (n > 0) {
    int got;
    int want = n < kBatch ? static_cast<int>(n) : kBatch;
    if (want > 1 && sandbox() == Sandbox::kNone) {
      unsigned char buf[kBatch];
      iovec iov[kBatch];
      mmsghdr msgs[kBatch];
      memset(msgs, 0, sizeof(mmsghdr) * static_cast<size_t>(want));
      for (int i = 0; i < want; ++i) {
        iov[i] = {&buf[i], 1};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      got = sys::real().recvmmsg(doorbell_.get(), msgs, static_cast<unsigned>(want), MSG_DONTWAIT, nullptr);
    } else {
      unsigned char buf[16];
      got = sys::real().read(doorbell_.get(), buf, sizeof buf) < 0 ? -1 : 1;
      want = 1;
    }
    if (got > 0) local().drained.fetch_add(static_cast<uint64_t>(got), std::memory_order_relaxed);
    if (got < want) {
      if (static_cast<int64_t>(rings - local().drained.load(std::memory_order_relaxed)) > 0)
        local().drained.store(rings, std::memory_order_relaxed);
      return;
    }
    n -= got;
  }
}

// One epoll_wait instead of poll() and a read: the doorbell sits in the set
// edge-triggered, so a ring wakes the sleep and needs no drain after it, and
// the TCP socket beside it still reports the peer's frames, FIN and RST.
// Only for the sole sleeper of this side (a second one polls: with one
// edge-triggered set, one ring would wake only one of them), and never in
// a sandbox (epoll is no call of the program's there).
bool ShmLink::sleep_edge(unsigned what, int tcp_fd, short tcp_events, int timeout_ms, short* revents, int* result) {
  if (edge_off_ || sandbox() != Sandbox::kNone) return false;
  if (local().sleepers.load(std::memory_order_relaxed) != sleeper_units(what)) return false;
  std::unique_lock<std::mutex> lock(edge_mu_, std::try_to_lock);
  if (!lock.owns_lock() || !edge_set(tcp_fd, tcp_events)) return false;
  edge_active_.fetch_add(1, std::memory_order_seq_cst);
  if (closing_.load(std::memory_order_seq_cst)) {
    edge_active_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  epoll_event ev[2];
  int n = sys::real().epoll_wait(epfd_.get(), ev, 2, timeout_ms);
  int e = errno;
  edge_active_.fetch_sub(1, std::memory_order_relaxed);
  errno = e;
  revents[0] = revents[1] = 0;
  for (int i = 0; i < n; ++i) revents[ev[i].data.u32 != 0] |= static_cast<short>(ev[i].events);
  *result = n;
  return true;
}

void ShmLink::pin_socket(int tcp_fd) {
  closing_.store(true, std::memory_order_seq_cst);
  if (edge_active_.load(std::memory_order_seq_cst) == 0 || pinned_) return;
  UniqueFd dup(sys::real().fcntl(tcp_fd, F_DUPFD_CLOEXEC, 0));
  if (dup && fds::keep(dup)) pinned_ = std::move(dup);
}

// Makes or updates the set; any failure turns it off for good (poll then).
bool ShmLink::edge_set(int tcp_fd, short tcp_events) {
  const auto& sys = sys::real();
  if (!epfd_) {
    UniqueFd ep(sys.epoll_create1(EPOLL_CLOEXEC));
    epoll_event bell{EPOLLIN | EPOLLET, {}};
    bell.data.u32 = 0;
    if (!ep || !fds::keep(ep) || sys.epoll_ctl(ep.get(), EPOLL_CTL_ADD, doorbell_.get(), &bell) != 0) {
      edge_off_ = true;
      return false;
    }
    epfd_ = std::move(ep);
  }
  if (tcp_fd == ep_tcp_ && tcp_events == ep_events_) return true;
  epoll_event tcp{static_cast<uint32_t>(static_cast<unsigned short>(tcp_events)), {}};
  tcp.data.u32 = 1;
  int op = tcp_fd == ep_tcp_ ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
  if (op == EPOLL_CTL_ADD && ep_tcp_ >= 0) sys.epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, ep_tcp_, nullptr);
  if (sys.epoll_ctl(epfd_.get(), op, tcp_fd, &tcp) != 0) {
    edge_off_ = true;
    return false;
  }
  ep_tcp_ = tcp_fd;
  ep_events_ = tcp_events;
  return true;
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

}  // namespace rdmashim::shm
