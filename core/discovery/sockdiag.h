// Asking the kernel who owns a socket (NETLINK_SOCK_DIAG), so that names in
// the abstract unix namespace, which anyone may bind, are only believed when
// their owner is the owner of the TCP socket they speak for.
//
// Every query is one exact lookup (no dump), on the process's reused netlink
// socket (util/reused_socket.h) for the lifetime of a Diag, or on one of the
// Diag's own if another question holds that one.
#pragma once

#include <sys/socket.h>

#include <cstdint>

#include "util/reused_socket.h"

namespace rdmashim::discovery {

// Normalized view of an AF_INET/AF_INET6 endpoint; IPv4-mapped IPv6 is IPv4.
struct Endpoint {
  int family = 0;  // AF_INET or AF_INET6, 0 if not TCP-capable
  unsigned char addr[16] = {};
  uint16_t port = 0;  // host order
  uint32_t scope = 0;
};
Endpoint normalize(const sockaddr* sa, socklen_t len);

constexpr uint8_t kTcpListen = 10;      // TCP_LISTEN in the kernel's numbering
constexpr uint8_t kTcpNewSynRecv = 12;  // TCP_NEW_SYN_RECV: a request socket

struct TcpOwner {
  uint32_t uid = 0;
  uint32_t inode = 0;
  uint8_t state = 0;  // TCP_LISTEN, TCP_ESTABLISHED, ...
  uint32_t rqueue = 0;  // bytes received and not read yet (a connected socket)
};

// One netlink socket for a few queries.
class Diag {
 public:
  Diag();
  // The TCP socket of this network namespace that a segment from `remote`
  // to `local` reaches: the connected socket with that 4-tuple, else the
  // listener the kernel would hand it to (`remote` may be an empty Endpoint
  // for that: the listener of `local`). False if none (or the lookup failed).
  bool tcp_owner(const Endpoint& local, const Endpoint& remote, TcpOwner* out);
  // The socket at the other end of the connected TCP socket `fd`, if it is
  // in this network namespace (false for a peer on another host).
  bool tcp_peer_owner(int fd, TcpOwner* out);
  // The uid that owns the server's end of the connected TCP socket `fd` (in
  // this namespace): the peer socket's, or while the server has not accepted
  // it yet, its listener's (an accepted socket inherits it). Asked when we
  // connect: by the time its Ack is read the server may have closed it.
  bool tcp_server_uid(int fd, uint32_t* uid);
  // The owner uid of the unix socket that `fd` (a connected unix socket of
  // ours) is connected to.
  bool unix_peer_uid(int fd, uint32_t* uid);

 private:
  int query(void* req, void* reply, size_t cap);
  bool tcp_peer_lookup(int fd, TcpOwner* out, Endpoint* peer_end);
  bool unix_attr(uint32_t inode, uint32_t show, uint16_t want, uint32_t* out);
  ReusedSocket::Lease nl_;
};

inline bool tcp_server_uid(int fd, uint32_t* uid) { return Diag().tcp_server_uid(fd, uid); }

}  // namespace rdmashim::discovery
