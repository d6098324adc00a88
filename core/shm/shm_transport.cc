#include "shm/shm_transport.h"

#include <cerrno>
#include <new>

namespace rdmashim::shm {

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
