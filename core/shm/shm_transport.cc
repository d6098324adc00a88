#include "shm/shm_transport.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdio>

#include "sys/sys.h"
#include "util/fd_budget.h"
#include <new>

namespace rdmashim::shm {

std::string ShmTransport::describe_for_exec() {
  Segment& s = link_.segment();
  const int fds[3] = {s.reopen_memfd(), s.doorbell(kClient), s.doorbell(kServer)};
  for (int fd : fds) {
    int fl = sys::real().fcntl(fd, F_GETFD);
    if (fl < 0 || sys::real().fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC) != 0) return "";
  }
  char buf[96];
  snprintf(buf, sizeof buf, "shm/%d/%d/%d/%d/%zu", self_ == kClient ? 0 : 1, fds[0], fds[1], fds[2],
           s.ring_size());
  return buf;
}

std::unique_ptr<ShmTransport> ShmTransport::adopt(const char* text, int* err) {
  int side = -1, memfd = -1, dc = -1, ds = -1;
  size_t ring = 0;
  if (sscanf(text, "shm/%d/%d/%d/%d/%zu", &side, &memfd, &dc, &ds, &ring) != 5 || (side != 0 && side != 1) ||
      ring < 4096 || (ring & (ring - 1)) != 0) {
    *err = -EINVAL;
    return nullptr;
  }
  // Ours again: close them if this image execs without handing them on.
  for (int fd : {memfd, dc, ds}) {
    sys::real().fcntl(fd, F_SETFD, FD_CLOEXEC);
    fds::adopt(fd);  // placed out of the program's way by the previous image
  }
  std::unique_ptr<Segment> segment = Segment::attach(UniqueFd(memfd), UniqueFd(dc), UniqueFd(ds), ring, err, false);
  if (!segment) return nullptr;
  std::unique_ptr<ShmTransport> t(new (std::nothrow) ShmTransport(std::move(segment), side == 0 ? kClient : kServer));
  if (!t) *err = -ENOMEM;
  return t;
}

// A lock between processes in shared memory. A holder that died (killed
// while holding it) is detected by its pid and the lock taken over, so a
// crashed sibling cannot wedge the survivor.
void ShmTransport::lock(Dir d) {
  std::atomic<int32_t>& owner = d == Dir::kRx ? link_.mine().rx_owner : link_.mine().tx_owner;
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
  std::atomic<int32_t>& owner = d == Dir::kRx ? link_.mine().rx_owner : link_.mine().tx_owner;
  owner.store(0, std::memory_order_release);
}

std::unique_ptr<ShmTransport> ShmTransport::offer(size_t ring_size, const unsigned char (&rendezvous)[kNameBytes],
                                                  const unsigned char (&nonce)[kNonceBytes],
                                                  const unsigned char (&token)[kTokenBytes], int* err) {
  std::unique_ptr<Segment> segment = Segment::create(ring_size, err);
  if (!segment) return nullptr;
  const int fds[kHandoffFds] = {segment->memfd(), segment->doorbell(kClient), segment->doorbell(kServer)};
  *err = send_descriptors(rendezvous, nonce, token, fds);
  if (*err != 0) return nullptr;
  std::unique_ptr<ShmTransport> t(new (std::nothrow) ShmTransport(std::move(segment), kServer));
  if (!t) *err = -ENOMEM;
  return t;
}

std::unique_ptr<ShmTransport> ShmTransport::accept(int listener, const unsigned char (&nonce)[kNonceBytes],
                                                   const unsigned char (&token)[kTokenBytes], uid_t server_uid,
                                                   size_t ring_size, int* err) {
  UniqueFd fds[kHandoffFds];
  *err = receive_descriptors(listener, nonce, token, server_uid, fds);
  if (*err != 0) return nullptr;
  std::unique_ptr<Segment> segment =
      Segment::attach(std::move(fds[0]), std::move(fds[1]), std::move(fds[2]), ring_size, err);
  if (!segment) return nullptr;
  std::unique_ptr<ShmTransport> t(new (std::nothrow) ShmTransport(std::move(segment), kClient));
  if (!t) *err = -ENOMEM;
  return t;
}

}  // namespace rdmashim::shm
