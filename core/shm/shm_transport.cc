#include "shm/shm_transport.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <new>

namespace rdmashim::shm {

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
                                                  const unsigned char (&token)[kTokenBytes], int* err) {
  std::unique_ptr<Segment> segment(Segment::create(ring_size, err));
  if (!segment) return nullptr;
  const int fds[kHandoffFds] = {segment->memfd(), segment->doorbell(kClient), segment->doorbell(kServer)};
  *err = send_descriptors(rendezvous, token, fds);
  if (*err != 0) return nullptr;
  segment->close_memfd();  // the mapping and the client's copy keep it alive
  std::unique_ptr<ShmTransport> t(new (std::nothrow) ShmTransport(std::move(segment), kServer));
  if (!t) *err = -ENOMEM;
  return t;
}

std::unique_ptr<ShmTransport> ShmTransport::accept(int listener, const unsigned char (&token)[kTokenBytes],
                                                   size_t ring_size, int* err) {
  UniqueFd fds[kHandoffFds];
  *err = receive_descriptors(listener, token, fds);
  if (*err != 0) return nullptr;
  std::unique_ptr<Segment> segment(
      Segment::attach(std::move(fds[0]), std::move(fds[1]), std::move(fds[2]), ring_size, err));
  if (!segment) return nullptr;
  segment->close_memfd();
  std::unique_ptr<ShmTransport> t(new (std::nothrow) ShmTransport(std::move(segment), kClient));
  if (!t) *err = -ENOMEM;
  return t;
}

}  // namespace rdmashim::shm
