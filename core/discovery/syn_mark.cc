#include "discovery/syn_mark.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <cerrno>
#include <cstring>

#include "sys/sys.h"

namespace rdmashim::discovery {

namespace {

// An IPv4 destination, or one mapped into IPv6: the IPv4 TTL goes on the SYN.
bool ipv4_path(const sockaddr* dest, socklen_t len) {
  if (dest->sa_family == AF_INET) return true;
  if (dest->sa_family != AF_INET6 || len < static_cast<socklen_t>(sizeof(sockaddr_in6))) return false;
  return IN6_IS_ADDR_V4MAPPED(&reinterpret_cast<const sockaddr_in6*>(dest)->sin6_addr);
}

}  // namespace

SynMark mark_syn(int fd, const sockaddr* dest, socklen_t len) {
  SynMark m;
  if (!dest || len < static_cast<socklen_t>(sizeof(sa_family_t))) return m;
  int saved = errno;
  const bool v4 = ipv4_path(dest, len);
  const int level = v4 ? SOL_IP : SOL_IPV6;
  const int name = v4 ? IP_TTL : IPV6_UNICAST_HOPS;
  const auto& sys = sys::real();
  int was = 0;
  socklen_t wlen = sizeof was;
  const int mark = kMarkTtl;
  if (sys.getsockopt(fd, level, name, &was, &wlen) == 0 && was != kMarkTtl &&
      sys.setsockopt(fd, level, name, &mark, sizeof mark) == 0) {
    m.level = level;
    m.name = name;
    m.was = was;
  }
  errno = saved;
  return m;
}

void unmark_syn(int fd, SynMark* m) {
  if (!m->active()) return;
  int saved = errno;
  sys::real().setsockopt(fd, m->level, m->name, &m->was, sizeof m->was);
  m->level = -1;
  errno = saved;
}

bool keep_syns(int listener) {
  int saved = errno;
  const auto& sys = sys::real();
  int on = 0;
  socklen_t len = sizeof on;
  bool ours = sys.getsockopt(listener, IPPROTO_TCP, TCP_SAVE_SYN, &on, &len) == 0 && on == 0;
  on = 1;
  ours = ours && sys.setsockopt(listener, IPPROTO_TCP, TCP_SAVE_SYN, &on, sizeof on) == 0;
  errno = saved;
  return ours;
}

SynSays read_syn(int fd) {
  // IPv4 (up to 60) or IPv6 (40, and extension headers), then TCP (up to 60).
  unsigned char headers[256];
  socklen_t len = sizeof headers;
  int saved = errno;
  int r = sys::real().getsockopt(fd, IPPROTO_TCP, TCP_SAVED_SYN, headers, &len);
  errno = saved;
  return r == 0 ? syn_says(headers, len) : SynSays::kUnknown;
}

SynSays syn_says(const unsigned char* h, size_t len) {
  if (len < 20) return SynSays::kUnknown;
  unsigned version = h[0] >> 4;
  int ttl = version == 4 ? h[8] : version == 6 && len >= 40 ? h[7] : -1;
  if (ttl < 0) return SynSays::kUnknown;
  return ttl == kMarkTtl ? SynSays::kMarked : SynSays::kUnmarked;
}

}  // namespace rdmashim::discovery
