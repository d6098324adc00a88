#include "discovery/registry.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "discovery/sockdiag.h"
#include "sys/sys.h"
#include "util/fd_budget.h"
#include "util/config.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/reused_socket.h"

namespace rdmashim::discovery {
namespace {

socklen_t entry_name(int family, const unsigned char* addr, uint16_t port, sockaddr_un* out) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(family, addr, text, sizeof text);
  memset(out, 0, sizeof *out);
  out->sun_family = AF_UNIX;
  int n = snprintf(out->sun_path + 1, sizeof out->sun_path - 1, "rdmashim/v1/tcp/%s/%u", text, port);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

ReusedSocket g_probe(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

// Asks whether an abstract name is bound by connecting to it, on the
// process's reused datagram socket. The connection is undone before the
// socket is reused: it would keep the name's socket alive.
class Probe {
 public:
  explicit Probe(bool fail) : s_(fail ? ReusedSocket::Lease() : g_probe.lease()) {}
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;
  ~Probe() {
    sockaddr none{};
    none.sa_family = AF_UNSPEC;
    if (connected_ && sys::real().connect(s_.fd(), &none, sizeof none) != 0) s_.discard();
  }
  explicit operator bool() const { return static_cast<bool>(s_); }
  int fd() const { return s_.fd(); }
  bool connect(const sockaddr_un& name, socklen_t len) {
    if (!s_ || sys::real().connect(s_.fd(), reinterpret_cast<const sockaddr*>(&name), len) != 0) return false;
    connected_ = true;
    return true;
  }

 private:
  ReusedSocket::Lease s_;
  bool connected_ = false;
};

bool entry_exists(Probe& probe, int family, const unsigned char* addr, uint16_t port) {
  sockaddr_un name;
  socklen_t len = entry_name(family, addr, port, &name);
  return !RDMASHIM_FAULT(kProbeConnect) && probe.connect(name, len);
}

// A client's announcement: "the socket with this inode will send a Hello".
socklen_t client_name(uint32_t inode, sockaddr_un* out) {
  memset(out, 0, sizeof *out);
  out->sun_family = AF_UNIX;
  int n = snprintf(out->sun_path + 1, sizeof out->sun_path - 1, "rdmashim/v1/client/%u", inode);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}


bool is_loopback(const Endpoint& e) {
  if (e.family == AF_INET) return e.addr[0] == 127;
  static const unsigned char kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return memcmp(e.addr, kLoop6, 16) == 0;
}

struct Rule {
  bool forbid;
  int family;
  unsigned char addr[16];
  int prefix;
};

bool parse_rules(const char* text, std::vector<Rule>* out, std::string* bad) {
  std::string all(text ? text : "");
  size_t start = 0;
  while (start <= all.size()) {
    size_t comma = all.find(',', start);
    std::string item = all.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? all.size() + 1 : comma + 1;
    if (item.empty()) continue;
    Rule r{};
    r.forbid = item[0] == '!';
    if (r.forbid) item.erase(0, 1);
    size_t slash = item.find('/');
    std::string host = item.substr(0, slash);
    r.family = host.find(':') != std::string::npos ? AF_INET6 : AF_INET;
    int bits = r.family == AF_INET ? 32 : 128;
    r.prefix = bits;
    if (slash != std::string::npos) {
      char* end = nullptr;
      long p = strtol(item.c_str() + slash + 1, &end, 10);
      if (*end != '\0' || end == item.c_str() + slash + 1 || p < 0 || p > bits) return *bad = item, false;
      r.prefix = static_cast<int>(p);
    }
    if (inet_pton(r.family, host.c_str(), r.addr) != 1) return *bad = item, false;
    out->push_back(r);
  }
  return true;
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> parsed = [] {
    std::vector<Rule> r;
    std::string bad;
    if (!parse_rules(config().peers, &r, &bad)) {
      RDMASHIM_WARN("ignoring RDMASHIM_PEERS: cannot parse '%s' (expected [!]ADDRESS[/PREFIX],...)", bad.c_str());
      r.clear();
    }
    return r;
  }();
  return parsed;
}

bool prefix_match(const unsigned char* a, const unsigned char* b, int bits) {
  int full = bits / 8, rest = bits % 8;
  if (memcmp(a, b, static_cast<size_t>(full)) != 0) return false;
  if (rest == 0) return true;
  unsigned char mask = static_cast<unsigned char>(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

}  // namespace

bool parse_peer_rules(const char* text, std::string* bad) {
  std::vector<Rule> r;
  return parse_rules(text, &r, bad);
}

PeerRule peer_rule(const sockaddr* peer, socklen_t len) {
  Endpoint e = normalize(peer, len);
  for (const Rule& r : rules()) {
    if (r.family == e.family && prefix_match(r.addr, e.addr, r.prefix)) {
      return r.forbid ? PeerRule::kForbid : PeerRule::kForce;
    }
  }
  return PeerRule::kDiscover;
}

UniqueFd advertise(const sockaddr* local, socklen_t len) {
  Endpoint e = normalize(local, len);
  if (e.family == 0) return UniqueFd();
  int saved = errno;
  UniqueFd fd(sys::real().socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un name;
  socklen_t n = entry_name(e.family, e.addr, e.port, &name);
  if (fd && (RDMASHIM_FAULT(kAdvertise) || sys::real().bind(fd.get(), reinterpret_cast<sockaddr*>(&name), n) != 0)) fd.reset();
  if (fd) fds::keep(fd);  // long-lived: out of the program's numbers (or not kept)
  errno = saved;
  return fd;
}

bool is_local_address(const sockaddr* sa, socklen_t len) {
  Endpoint e = normalize(sa, len);
  if (e.family == 0) return false;
  if (is_loopback(e)) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    Endpoint a = normalize(i->ifa_addr, i->ifa_addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                                             : sizeof(sockaddr_in));
    found = a.family == e.family && memcmp(a.addr, e.addr, e.family == AF_INET ? 4 : 16) == 0;
  }
  freeifaddrs(list);
  return found;
}

// The advertisement `probe` is connected to speaks for the TCP listener a
// connection to `e` reaches only if one user owns both: anyone may bind an
// abstract name, but only the listener's owner (or root acting as it) can
// make the kernel report the same uid for both sockets.
static bool advert_owns_listener(int probe, const Endpoint& e) {
  uint32_t advertiser = 0;
  TcpOwner listener;
  Diag diag;
  if (!diag.unix_peer_uid(probe, &advertiser)) return false;
  if (!diag.tcp_owner(e, Endpoint{}, &listener) || listener.state != kTcpListen) return false;
  if (listener.uid == advertiser) return true;
  RDMASHIM_DEBUG("ignoring the advertisement of port %u: owned by uid %u, the listener by uid %u", e.port,
                 advertiser, listener.uid);
  return false;
}

bool peer_advertised(const sockaddr* peer, socklen_t len) {
  Endpoint e = normalize(peer, len);
  if (e.family == 0) return false;
  switch (peer_rule(peer, len)) {
    case PeerRule::kForce: return true;
    case PeerRule::kForbid: return false;
    case PeerRule::kDiscover: break;
  }
  int saved = errno;
  Probe probe(RDMASHIM_FAULT(kProbeSocket));
  bool found = false;
  if (probe) {
    static const unsigned char kAny[16] = {};
    found = entry_exists(probe, e.family, e.addr, e.port) ||
            entry_exists(probe, e.family, kAny, e.port) ||
            // A dual-stack IPv6 wildcard listener also takes IPv4 clients.
            (e.family == AF_INET && entry_exists(probe, AF_INET6, kAny, e.port));
  }
  // Then whether the advertiser owns the listener, and last (the dearest):
  // only a destination in this namespace can be the advertised listener.
  found = found && advert_owns_listener(probe.fd(), e) && is_local_address(peer, len);
  errno = saved;
  return found;
}

Announcement announce_client(int fd, const sockaddr* dest, socklen_t len) {
  Announcement a;
  struct stat st{};
  if (fstat(fd, &st) != 0) return a;
  int saved = errno;
  a.name = UniqueFd(sys::real().socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un name;
  socklen_t n = client_name(static_cast<uint32_t>(st.st_ino), &name);
  if (a.name && sys::real().bind(a.name.get(), reinterpret_cast<sockaddr*>(&name), n) != 0) a.name.reset();
  if (a.name) {
    fds::keep(a.name);  // lives until the handshake settles: not in the program's numbers
    a.mark = mark_syn(fd, dest, len);
  }
  errno = saved;
  return a;
}

bool client_announced(int fd, bool* local) {
  // The client's own socket, if it is in this namespace: its inode names the
  // announcement, its owner must own the announcement too.
  TcpOwner client;
  Diag diag;
  *local = diag.tcp_peer_owner(fd, &client);
  if (!*local) return false;
  int saved = errno;
  Probe probe(false);
  sockaddr_un name;
  socklen_t n = client_name(client.inode, &name);
  uint32_t owner = 0;
  bool yes = probe.connect(name, n) && diag.unix_peer_uid(probe.fd(), &owner) && owner == client.uid;
  errno = saved;
  return yes;
}

}  // namespace rdmashim::discovery
