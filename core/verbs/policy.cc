#include "verbs/policy.h"

#include <sys/stat.h>

#include <cstdio>

#include "verbs/device.h"

namespace rdmashim::verbs {

Judgement judge(const DeviceFacts& f, TransportChoice transport, bool soft_verbs) {
  Judgement j;
  auto sign = [&](const char* s) {
    if (!j.evidence.empty()) j.evidence += ", ";
    j.evidence += s;
  };
  if (f.vendor_id == kRxeVendorId) sign("vendor 0xffffff (Soft-RoCE)");
  if (f.vendor_id == kSiwVendorId) sign("vendor 0x626d74 (soft-iWARP)");
  if (f.sysfs_seen && !f.has_parent) sign("no parent device");
  if (f.name.rfind("rxe", 0) == 0 || f.name.rfind("siw", 0) == 0) sign("named like a software provider");
  j.software = !j.evidence.empty();
  if (!j.software) {
    j.reason = f.name + " is a hardware RDMA device: connections to other hosts use verbs";
    return j;
  }
  const char* asked = transport == TransportChoice::kVerbs ? "RDMASHIM_TRANSPORT=verbs"
                      : soft_verbs                         ? "RDMASHIM_SOFT_VERBS=1"
                                                           : nullptr;
  j.remote_allowed = asked != nullptr;
  j.reason = f.name + " is a software RDMA device (" + j.evidence + "), slower than kernel TCP across hosts: " +
             (asked ? std::string("connections to other hosts use verbs because ") + asked + " asks for it"
                    : std::string("connections to other hosts stay on TCP (RDMASHIM_SOFT_VERBS=1 uses verbs)"));
  return j;
}

DeviceFacts gather_facts(const char* name, uint32_t vendor_id) {
  DeviceFacts f;
  f.name = name;
  f.vendor_id = vendor_id;
  char path[256];
  struct stat st{};
  snprintf(path, sizeof path, "/sys/class/infiniband/%s", name);
  f.sysfs_seen = stat(path, &st) == 0;
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/device", name);
  f.has_parent = f.sysfs_seen && stat(path, &st) == 0;
  return f;
}

const Judgement* device_judgement() {
  int err = 0;
  Device* dev = Device::get(&err);
  return dev ? &dev->judgement() : nullptr;
}

bool remote_refused(const char** why) {
  int err = 0;
  Device* dev = Device::get(&err);
  if (!dev || dev->judgement().remote_allowed) return false;
  *why = dev->refusal();
  return true;
}

}  // namespace rdmashim::verbs
