#include "verbs/verbs_transport.h"

#include <cerrno>
#include <new>

#include "verbs/device.h"

namespace rdmashim::verbs {

std::unique_ptr<VerbsTransport> VerbsTransport::prepare(const sockaddr* local, size_t ring_size, int* err) {
  Device* dev = Device::get(err);
  if (!dev) return nullptr;
  std::unique_ptr<VerbsLink> link = VerbsLink::create(*dev, ring_size, local, err);
  if (!link) return nullptr;
  std::unique_ptr<VerbsTransport> t(new (std::nothrow) VerbsTransport(std::move(link)));
  if (!t) *err = -ENOMEM;
  return t;
}

}  // namespace rdmashim::verbs
