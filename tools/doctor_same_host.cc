// rdmashim doctor, the same-host part: can two processes of this machine
// move a connection onto shared memory? Each check is what the library
// itself needs, done the same way, so a failure here is why connections
// stay on TCP (the library says so only at debug level, once per connection).
#include "doctor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "discovery/sockdiag.h"
#include "ring/ring_limits.h"
#include "shm/local_state.h"
#include "shm/segment.h"
#include "util/config.h"
#include "util/unique_fd.h"

namespace rdmashim::tools {
namespace {

std::string why(const char* call) { return std::string(call) + ": " + strerror(errno); }

// A server's segment and a side's local page, made as a connection makes
// them (a sealed memfd mapped shared, and a page of our own).
DoctorLine check_memfd() {
  int err = 0;
  if (!shm::Segment::create(kMinRingSize, &err)) {
    return {false, std::string("shm-memfd the segment cannot be made: ") + strerror(-err)};
  }
  if (!shm::LocalPage::create(&err)) {
    return {false, std::string("shm-memfd the local page cannot be made: ") + strerror(-err)};
  }
  return {true, "shm-memfd sealed memfd created and mapped shared"};
}

// Discovery: a client believes a listener's abstract name only once
// NETLINK_SOCK_DIAG said who owns both (discovery/sockdiag.h). A kernel
// without inet_diag/unix_diag answers nothing, and nothing upgrades.
DoctorLine check_discovery() {
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (!listener || bind(listener.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      listen(listener.get(), 1) != 0 || getsockname(listener.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return {false, "shm-discovery " + why("a loopback TCP listener")};
  }
  discovery::Diag diag;
  discovery::TcpOwner owner;
  if (!diag.tcp_owner(discovery::normalize(reinterpret_cast<sockaddr*>(&sa), len), discovery::Endpoint{}, &owner) ||
      owner.state != discovery::kTcpListen || owner.uid != geteuid()) {
    return {false, "shm-discovery inet_diag does not answer (is the inet_diag module available?): "
                   "same-host connections stay on TCP"};
  }
  sockaddr_un name{};
  name.sun_family = AF_UNIX;
  int n = snprintf(name.sun_path + 1, sizeof name.sun_path - 1, "rdmashim/doctor/%d", static_cast<int>(getpid()));
  socklen_t name_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  UniqueFd bound(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)), probe(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!bound || !probe || bind(bound.get(), reinterpret_cast<sockaddr*>(&name), name_len) != 0 ||
      connect(probe.get(), reinterpret_cast<sockaddr*>(&name), name_len) != 0) {
    return {false, "shm-discovery " + why("an abstract unix socket")};
  }
  uint32_t uid = 0;
  if (!diag.unix_peer_uid(probe.get(), &uid) || uid != geteuid()) {
    return {false, "shm-discovery unix_diag does not answer (is the unix_diag module available?): "
                   "same-host connections stay on TCP"};
  }
  return {true, "shm-discovery sock_diag names the owners of a TCP listener and of an abstract name"};
}

}  // namespace

std::vector<DoctorLine> same_host_checks() {
  std::vector<DoctorLine> lines;
  const Config& cfg = config();
  if (cfg.disabled || cfg.transport == TransportChoice::kTcp) {
    lines.push_back({false, std::string("settings ") + (cfg.disabled ? "RDMASHIM_DISABLE=1" : "RDMASHIM_TRANSPORT=tcp") +
                                ": every connection stays on TCP"});
  } else {
    lines.push_back({true, std::string("settings RDMASHIM_TRANSPORT=") + transport_name(cfg.transport)});
  }
  lines.push_back(check_memfd());
  lines.push_back(check_discovery());
  return lines;
}

}  // namespace rdmashim::tools
