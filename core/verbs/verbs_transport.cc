#include "verbs/verbs_transport.h"

#include <cerrno>
#include <new>

#include <sys/resource.h>
#include <unistd.h>

#include "ring/ring_limits.h"

#include "verbs/device.h"

namespace rdmashim::verbs {

size_t VerbsTransport::ring_size_for(int fd) {
  size_t ring = tcp_equivalent_ring_size(fd);
  rlimit rl{};
  // root (CAP_IPC_LOCK) registers past the limit.
  if (geteuid() == 0 || getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return ring;
  constexpr uint64_t kStage = VerbsLink::kStageBytes;
  uint64_t per_ring = rl.rlim_cur > kStage * 2 ? (rl.rlim_cur - kStage * 2) / 2 : 0;
  size_t cap = size_t{64} << 10;  // below this, TCP is the better deal: let registration decide
  while (cap * 2 <= per_ring && cap * 2 <= ring) cap *= 2;
  return ring < cap ? ring : cap;
}

std::unique_ptr<VerbsTransport> VerbsTransport::prepare(const sockaddr* local, size_t ring_size, int* err,
                                                       const char** limit) {
  Device* dev = Device::get(err);
  if (!dev) return nullptr;
  std::unique_ptr<VerbsLink> link = VerbsLink::create(*dev, ring_size, local, err, limit);
  if (!link) return nullptr;
  std::unique_ptr<VerbsTransport> t(new (std::nothrow) VerbsTransport(std::move(link)));
  if (!t) *err = -ENOMEM;
  return t;
}

}  // namespace rdmashim::verbs
