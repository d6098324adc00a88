// Same-host discovery: who listens under rdmashim in this network namespace.
//
// A listener under rdmashim binds a datagram unix socket in the abstract
// namespace under a name derived from its address and port. Abstract names are
// per network namespace and vanish when the last descriptor closes, so a
// crashed server never leaves a stale entry. A client asks with connect() on a
// datagram socket: that only checks the name exists, sends nothing and queues
// nothing, so probes can never pile up anywhere.
//
// A client under rdmashim speaks first (Hello) only when the destination is an
// address of this namespace and an entry for it exists; otherwise it sends
// nothing extra, ever.
#pragma once

#include <sys/socket.h>

#include <string>

#include "util/unique_fd.h"

namespace rdmashim::discovery {

// Advertises a listening socket's own address (wildcards included). Returns
// the descriptor that keeps the entry alive (its owner closes it with the
// listener), or an invalid one if the address is not TCP or already taken
// by another listener of the same port (SO_REUSEPORT groups share one).
UniqueFd advertise(const sockaddr* local, socklen_t len);

// True if a listener under rdmashim advertised `peer` (or the wildcard of
// its family, or the IPv6 wildcard for IPv4) and `peer` is local.
bool peer_advertised(const sockaddr* peer, socklen_t len);

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
