// Whether verbs to another host is worth taking on this process's device.
//
// A software provider (Soft-RoCE "rxe", soft-iWARP "siw") runs RDMA in this
// host's kernel on top of its own network stack: between two Soft-RoCE
// guests a 64 B ping-pong made 650 round trips/s on verbs against kernel
// TCP's 1,694. So RDMASHIM_TRANSPORT=auto keeps connections to other hosts
// on TCP when this end's device is software, unless asked for it
// (RDMASHIM_SOFT_VERBS=1, or RDMASHIM_TRANSPORT=verbs). Each end judges its
// own device: the client does not offer verbs, the server declines it in
// its Ack (kFallbackSoftware) and answers no RDMA-CM probe; either way both
// ends stay on TCP with every byte where TCP would put it.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "util/config.h"

namespace rdmashim::verbs {

// What this host tells about a device, gathered in device.cc (and by
// `rdmashim doctor`); injected by the unit tests.
struct DeviceFacts {
  std::string name;             // "rxe0", or whatever `rdma link add` named it
  uint32_t vendor_id = 0;       // ibv_query_device: rxe 0xffffff, siw 0x626d74
  bool sysfs_seen = false;      // /sys/class/infiniband/<name> exists
  bool has_parent = false;      // .../device exists: a PCI (or auxiliary) device behind it
};

inline constexpr uint32_t kRxeVendorId = 0xffffff;
inline constexpr uint32_t kSiwVendorId = 0x626d74;  // "bmt"

struct Judgement {
  bool software = false;       // the device is a software provider
  bool remote_allowed = true;  // verbs to another host may be used
  // Said in the log, `rdmashim doctor` and the TCP reason:
  std::string evidence;  // "vendor 0xffffff (rxe), no parent device"; "" for hardware
  std::string reason;    // one sentence: what is chosen across hosts and why
};

// The facts of an open device (its sysfs entry read here).
DeviceFacts gather_facts(const char* name, uint32_t vendor_id);

// Any one sign makes the device software: a renamed rxe still has rxe's
// vendor id and no parent device. Without sysfs (a container) the parent
// check says nothing. A hardware iWARP NIC has a parent device.
Judgement judge(const DeviceFacts& facts, TransportChoice transport, bool soft_verbs);

// The process's device's judgement (opening the device if need be); nullptr
// when there is no usable device.
const Judgement* device_judgement();

// True when a connection to another host must stay on TCP because this
// end's device is software and nobody asked for it; *why is then the short
// reason for the log line ("software rdma rxe0"), valid for the process's life.
bool remote_refused(const char** why);

}  // namespace rdmashim::verbs
