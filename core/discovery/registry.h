// Same-host discovery: who listens under rdmashim in this network namespace.
//
// A listener under rdmashim binds a datagram unix socket in the abstract
// namespace under a name derived from its address and port. Abstract names are
// per network namespace and vanish when the last descriptor closes, so a
// crashed server never leaves a stale entry. A client asks with connect() on a
// datagram socket: that only checks the name exists, sends nothing and queues
// nothing, so probes can never pile up anywhere.
//
// Anyone may bind any abstract name, so an entry is believed only when its
// owner (uid, from unix_diag) is the owner of the TCP listener the client
// is about to reach (uid, from inet_diag): a squatter on a plain server's
// port is ignored. Costs two more netlink round trips, only when a name is
// found.
//
// A client under rdmashim speaks first (Hello) only when the destination is an
// address of this namespace and an entry for it exists; otherwise it sends
// nothing extra, ever.
#pragma once

#include <sys/socket.h>

#include <string>

#include "discovery/syn_mark.h"
#include "util/unique_fd.h"

namespace rdmashim::discovery {

// Advertises a listening socket's own address (wildcards included). Returns
// the descriptor that keeps the entry alive (its owner closes it with the
// listener), or an invalid one if the address is not TCP or already taken
// by another listener of the same port (SO_REUSEPORT groups share one).
UniqueFd advertise(const sockaddr* local, socklen_t len);

// True if a listener under rdmashim advertised `peer` (or the wildcard of
// its family, or the IPv6 wildcard for IPv4), the advertisement's owner
// (unix_diag) is the owner of the TCP listener `peer` reaches (inet_diag),
// and `peer` is local.
bool peer_advertised(const sockaddr* peer, socklen_t len);

// Client, before connect() to `dest`: announces that the TCP socket `fd` is
// under rdmashim and will send a Hello, under a name derived from its inode,
// and marks its SYN (syn_mark.h) so that the server knows to look. The
// announcement lives until withdrawn (once the handshake settled) or dropped.
struct Announcement {
  UniqueFd name;  // keeps the name bound
  SynMark mark;
  explicit operator bool() const { return static_cast<bool>(name); }
  // The name goes and the program's TTL comes back.
  void withdraw(int tcp_fd) {
    name.reset();
    unmark_syn(tcp_fd, &mark);
  }
};
Announcement announce_client(int fd, const sockaddr* dest, socklen_t len);

// Server, about to write first: whether the peer of the connected socket
// `fd` is a socket of this namespace that announced itself, with the
// announcement owned by the peer socket's owner (so nobody can make a server
// wait for a Hello from a plain client). *local: whether the peer socket is
// in this namespace at all.
bool client_announced(int fd, bool* local);

// RDMASHIM_PEERS: comma-separated [!]ADDRESS[/PREFIX] entries, first match
// wins. A plain entry forces the destination to be treated as running
// rdmashim (cross-host peers, until they can be discovered); a '!' entry
// forbids it. Anything else follows discovery.
enum class PeerRule { kDiscover, kForce, kForbid };
PeerRule peer_rule(const sockaddr* peer, socklen_t len);
// Parses a rule list; false (with the offending entry in *bad) if malformed.
bool parse_peer_rules(const char* text, std::string* bad);

// True if `addr` is an address of this network namespace.
bool is_local_address(const sockaddr* addr, socklen_t len);

}  // namespace rdmashim::discovery
