#include "discovery/sockdiag.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "sys/sys.h"
#include "util/fault.h"
#include "util/unique_fd.h"

namespace rdmashim::discovery {
namespace {

ReusedSocket g_netlink(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
std::atomic<uint32_t> g_seq{0};  // per process, so an answer left unread never matches

}  // namespace

Diag::Diag() : nl_(RDMASHIM_FAULT(kSockdiag) ? ReusedSocket::Lease() : g_netlink.lease()) {}

// Sends one request and copies the first answer into `reply`. Returns the
// answer's payload length, or -1 (no such socket, or the query failed).
int Diag::query(void* request, void* reply, size_t cap) {
  const auto& sys = sys::real();
  auto* req = static_cast<nlmsghdr*>(request);
  if (!nl_) return -1;
  req->nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req->nlmsg_flags = NLM_F_REQUEST;
  req->nlmsg_seq = g_seq.fetch_add(1, std::memory_order_relaxed) + 1;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sys.sendto(nl_.fd(), req, req->nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) !=
      static_cast<ssize_t>(req->nlmsg_len)) {
    nl_.discard();
    return -1;
  }
  // An exact lookup has one answer (the socket, or NLMSG_ERROR), queued
  // before sendto() returned. One of another sequence number would be a
  // question's answer left unread: skipped, and the socket not reused.
  alignas(nlmsghdr) unsigned char buf[1024];
  for (int tries = 0; tries < 4; ++tries) {
    ssize_t n = sys.recv(nl_.fd(), buf, sizeof buf, tries == 0 ? 0 : MSG_DONTWAIT);
    auto* h = reinterpret_cast<nlmsghdr*>(buf);
    if (n < static_cast<ssize_t>(sizeof *h) || !NLMSG_OK(h, static_cast<unsigned>(n))) break;
    if (h->nlmsg_seq != req->nlmsg_seq) {
      nl_.discard();
      continue;
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) return -1;  // NLMSG_ERROR: ENOENT for no such socket
    size_t len = h->nlmsg_len - NLMSG_HDRLEN;
    if (len > cap) len = cap;
    memcpy(reply, NLMSG_DATA(h), len);
    return static_cast<int>(len);
  }
  nl_.discard();
  return -1;
}

// One unix socket by inode: the attribute `want` (a u32) of UDIAG_SHOW_* `show`.
bool Diag::unix_attr(uint32_t inode, uint32_t show, uint16_t want, uint32_t* out) {
  struct {
    nlmsghdr h;
    unix_diag_req r;
  } req{};
  req.h.nlmsg_len = sizeof req;
  req.r.sdiag_family = AF_UNIX;
  req.r.udiag_ino = inode;
  req.r.udiag_show = show;
  req.r.udiag_cookie[0] = req.r.udiag_cookie[1] = INET_DIAG_NOCOOKIE;
  alignas(unix_diag_msg) unsigned char buf[512];
  int n = query(&req, buf, sizeof buf);
  if (n < static_cast<int>(sizeof(unix_diag_msg))) return false;
  if (reinterpret_cast<unix_diag_msg*>(buf)->udiag_ino != inode) return false;
  int off = NLMSG_ALIGN(sizeof(unix_diag_msg));
  while (off + static_cast<int>(sizeof(nlattr)) <= n) {
    nlattr a;
    memcpy(&a, buf + off, sizeof a);
    if (a.nla_len < sizeof a || off + a.nla_len > n) return false;
    if ((a.nla_type & NLA_TYPE_MASK) == want && a.nla_len >= sizeof a + sizeof(uint32_t)) {
      memcpy(out, buf + off + NLA_HDRLEN, sizeof *out);
      return true;
    }
    off += NLA_ALIGN(a.nla_len);
  }
  return false;
}

Endpoint normalize(const sockaddr* sa, socklen_t len) {
  Endpoint e;
  if (!sa) return e;
  if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    e.family = AF_INET;
    memcpy(e.addr, &in->sin_addr, 4);
    e.port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      e.family = AF_INET;
      memcpy(e.addr, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      e.family = AF_INET6;
      memcpy(e.addr, &in6->sin6_addr, 16);
      e.scope = in6->sin6_scope_id;
    }
    e.port = ntohs(in6->sin6_port);
  }
  return e;
}

bool Diag::tcp_owner(const Endpoint& local, const Endpoint& remote, TcpOwner* out) {
  if (local.family == 0 || (remote.family != 0 && remote.family != local.family)) return false;
  struct {
    nlmsghdr h;
    inet_diag_req_v2 r;
  } req{};
  req.h.nlmsg_len = sizeof req;
  req.r.sdiag_family = static_cast<uint8_t>(local.family);
  req.r.sdiag_protocol = IPPROTO_TCP;
  req.r.idiag_states = ~0U;
  req.r.id.idiag_sport = htons(local.port);
  req.r.id.idiag_dport = htons(remote.port);
  size_t bytes = local.family == AF_INET ? 4 : 16;
  memcpy(req.r.id.idiag_src, local.addr, bytes);
  memcpy(req.r.id.idiag_dst, remote.addr, bytes);
  req.r.id.idiag_if = local.scope;
  req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  inet_diag_msg m{};
  int saved = errno;
  int n = query(&req, &m, sizeof m);
  errno = saved;
  if (n < static_cast<int>(sizeof m)) return false;
  out->uid = m.idiag_uid;
  out->inode = m.idiag_inode;
  out->state = m.idiag_state;
  out->rqueue = m.idiag_rqueue;
  return true;
}

// The TCP socket the kernel would hand a segment from `fd`'s side to (looked
// up from the peer's side: local is its address, remote ours): the connected
// peer socket, a request socket, or, with none, the listener of that port.
bool Diag::tcp_peer_lookup(int fd, TcpOwner* out, Endpoint* peer_end) {
  sockaddr_storage self{}, peer{};
  socklen_t slen = sizeof self, plen = sizeof peer;
  if (sys::real().getsockname(fd, reinterpret_cast<sockaddr*>(&self), &slen) != 0 ||
      sys::real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) {
    return false;
  }
  *peer_end = normalize(reinterpret_cast<sockaddr*>(&peer), plen);
  return tcp_owner(*peer_end, normalize(reinterpret_cast<sockaddr*>(&self), slen), out);
}

bool Diag::tcp_peer_owner(int fd, TcpOwner* out) {
  Endpoint peer;
  // A listener is not a peer.
  return tcp_peer_lookup(fd, out, &peer) && out->state != kTcpListen;
}

bool Diag::tcp_server_uid(int fd, uint32_t* uid) {
  Endpoint peer;
  TcpOwner o;
  if (!tcp_peer_lookup(fd, &o, &peer)) return false;
  // A request socket reports uid 0: its listener's owner is the child's.
  if (o.state == kTcpNewSynRecv && !(tcp_owner(peer, Endpoint{}, &o) && o.state == kTcpListen)) return false;
  *uid = o.uid;
  return true;
}

bool Diag::unix_peer_uid(int fd, uint32_t* uid) {
  struct stat st{};
  if (fstat(fd, &st) != 0) return false;
  int saved = errno;
  uint32_t peer = 0;
  bool ok = unix_attr(static_cast<uint32_t>(st.st_ino), UDIAG_SHOW_PEER, UNIX_DIAG_PEER, &peer) && peer != 0 &&
            unix_attr(peer, UDIAG_SHOW_UID, UNIX_DIAG_UID, uid);
  errno = saved;
  return ok;
}

}  // namespace rdmashim::discovery
