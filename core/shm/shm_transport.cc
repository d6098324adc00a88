#include "shm/shm_transport.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdio>

#include <sys/eventfd.h>

#include <cstring>
#include <new>

#include "sys/sys.h"
#include "util/fault.h"
#include "util/fd_budget.h"

namespace rdmashim::shm {

// Text: "shm/side/memfd/doorbell/local/ring".
std::string ShmTransport::describe_for_exec() {
  if (pinned_) return "";
  const int fds[3] = {link_.segment().reopen_memfd(), link_.wait_fd(), link_.local_page().reopen_fd()};
  for (int fd : fds) {
    int fl = sys::real().fcntl(fd, F_GETFD);
    if (fl < 0 || sys::real().fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC) != 0) return "";
  }
  char buf[96];
  snprintf(buf, sizeof buf, "shm/%d/%d/%d/%d/%zu", self_ == kClient ? 0 : 1, fds[0], fds[1], fds[2],
           link_.ring_size());
  return buf;
}

std::unique_ptr<ShmTransport> ShmTransport::make(std::unique_ptr<Segment> segment, UniqueFd doorbell, Side self,
                                                 std::unique_ptr<LocalPage> local, int* err) {
  if (!local) local = LocalPage::create(err);
  if (!local) return nullptr;
  std::unique_ptr<ShmTransport> t(
      new (std::nothrow) ShmTransport(std::move(segment), std::move(local), std::move(doorbell), self));
  if (!t) *err = -ENOMEM;
  return t;
}

std::unique_ptr<ShmTransport> ShmTransport::adopt(const char* text, int* err) {
  int side = -1, memfd = -1, bell = -1, local_fd = -1;
  size_t ring = 0;
  if (sscanf(text, "shm/%d/%d/%d/%d/%zu", &side, &memfd, &bell, &local_fd, &ring) != 5 || (side != 0 && side != 1) ||
      ring < 4096 || (ring & (ring - 1)) != 0) {
    *err = -EINVAL;
    return nullptr;
  }
  // Ours again: close them if this image execs without handing them on.
  for (int fd : {memfd, bell, local_fd}) {
    sys::real().fcntl(fd, F_SETFD, FD_CLOEXEC);
    fds::adopt(fd);  // placed out of the program's way by the previous image
  }
  UniqueFd doorbell(bell);
  std::unique_ptr<LocalPage> local = LocalPage::adopt(UniqueFd(local_fd), err);
  std::unique_ptr<Segment> segment = Segment::attach(UniqueFd(memfd), ring, err, false);
  if (!segment || !local) return nullptr;
  return make(std::move(segment), std::move(doorbell), side == 0 ? kClient : kServer, std::move(local), err);
}

std::unique_ptr<ShmTransport> ShmTransport::hold(Side self, size_t ring_size, uint64_t head, uint64_t end,
                                                 bool left, Fill fill, void* ctx, int* err) {
  std::unique_ptr<Segment> segment = Segment::create(ring_size, err);
  if (!segment) return nullptr;
  std::unique_ptr<LocalPage> local = LocalPage::create(err);
  if (!local) return nullptr;
  UniqueFd bell(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!bell || !fds::keep(bell)) {
    *err = bell ? -EMFILE : -errno;
    return nullptr;
  }
  // The bytes at their stream positions (a map word of 0: byte p at p mod size).
  const uint64_t off = head & (ring_size - 1), n = end - head;
  unsigned char* rx = segment->rx_ring(self);
  const iovec iov[2] = {{rx + off, n < ring_size - off ? n : ring_size - off},
                        {rx, n < ring_size - off ? 0 : n - (ring_size - off)}};
  if (n > ring_size || !fill(ctx, iov, 2)) {
    *err = -EPROTO;
    return nullptr;
  }
  const Side peer = self == kClient ? kServer : kClient;
  SegmentHeader* h = segment->header();
  h->side[peer].produced.value.store(end, std::memory_order_relaxed);
  h->side[self].consumed.value.store(head, std::memory_order_relaxed);
  h->side[self].attached.store(1, std::memory_order_relaxed);
  h->side[peer].attached.store(1, std::memory_order_relaxed);
  LocalState& st = local->state();
  st.consumed.store(head, std::memory_order_relaxed);
  st.rx_switched.store(1, std::memory_order_relaxed);
  st.tx_switched.store(1, std::memory_order_relaxed);
  if (left) st.rx_left_at.store(end + 1, std::memory_order_release);
  return make(std::move(segment), std::move(bell), self, std::move(local), err);
}

// A lock between processes in shared memory. A holder that died (killed
// while holding it) is detected by its pid and the lock taken over, so a
// crashed sibling cannot wedge the survivor.
void ShmTransport::lock(Dir d) {
  std::atomic<int32_t>& owner = d == Dir::kRx ? local().rx_owner : local().tx_owner;
  const int32_t self = static_cast<int32_t>(getpid());
  for (uint32_t i = 1;; ++i) {
    int32_t expected = 0;
    if (owner.compare_exchange_weak(expected, self, std::memory_order_acquire)) return;
    if ((i & 63) == 0) sched_yield();
    if ((i & 65535) == 0 && expected != 0 && kill(expected, 0) != 0 && errno == ESRCH) {
      owner.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
    }
  }
}

void ShmTransport::unlock(Dir d) {
  std::atomic<int32_t>& owner = d == Dir::kRx ? local().rx_owner : local().tx_owner;
  owner.store(0, std::memory_order_release);
}

std::unique_ptr<ShmTransport> ShmTransport::offer(size_t ring_size, size_t tx_limit,
                                                  const unsigned char (&rendezvous)[kNameBytes],
                                                  const unsigned char (&nonce)[kNonceBytes],
                                                  const unsigned char (&token)[kTokenBytes], int* err) {
  std::unique_ptr<Segment> segment = Segment::create(ring_size, err);
  if (!segment) return nullptr;
  std::unique_ptr<LocalPage> local = LocalPage::create(err);  // before anything reaches the client
  if (!local) return nullptr;
  if (tx_limit < ring_size) local->state().tx_limit.store(tx_limit, std::memory_order_relaxed);
  const int fds[kHandoffFds] = {segment->memfd()};
  UniqueFd doorbell;
  *err = send_descriptors(rendezvous, nonce, token, fds, &doorbell);
  if (*err != 0) return nullptr;
  auto t = make(std::move(segment), std::move(doorbell), kServer, std::move(local), err);
  if (t) t->pinned_ = RDMASHIM_FAULT(kShmFork);
  return t;
}

std::unique_ptr<ShmTransport> ShmTransport::accept(UniqueFd listener, const unsigned char (&nonce)[kNonceBytes],
                                                   const unsigned char (&token)[kTokenBytes], uid_t server_uid,
                                                   size_t ring_size, int* err) {
  UniqueFd fds[kHandoffFds];
  *err = receive_descriptors(listener.get(), nonce, token, server_uid, fds);
  if (*err != 0) return nullptr;
  std::unique_ptr<Segment> segment = Segment::attach(std::move(fds[0]), ring_size, err);
  if (!segment) return nullptr;
  auto t = make(std::move(segment), std::move(listener), kClient, nullptr, err);
  if (t) t->pinned_ = RDMASHIM_FAULT(kShmFork);
  return t;
}

}  // namespace rdmashim::shm
