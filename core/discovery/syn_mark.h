// The mark on an announcing client's SYN: tells a server that speaks first
// whether asking about an announcement can find one at all.
//
// A server whose program writes before any Hello came asks whether its
// client announced one (registry.h: an inet_diag question and a probe, about
// 6.5 us). Nearly every client of such a server is plain, and paid that wait
// for its greeting. So a client that announces also sends its SYN with the
// largest TTL (IPv6: hop limit), 255, and a listener under rdmashim keeps the
// SYNs it gets (TCP_SAVE_SYN): one getsockopt on the accepted socket says
// whether the question is worth asking.
//
// The mark is only a hint. Marked (or a program's own TTL of 255): the
// question is asked, as before, with its ownership checks. Unknown (the SYN
// was not kept: syncookies, a listener the program keeps SYNs for itself, an
// old kernel): asked. Unmarked: no client on this host announced this
// connection (another host's announcement is a separate, cheap look). So
// nobody can make a server wait with it, and a client can only make its own
// connections ask.
//
// Why the TTL: a same-host connection never crosses a router, so the value
// changes nothing on the way, and 255 is at least any TTL the program would
// have sent (a server's IP_MINTTL, as in GTSM, still takes our SYN). The
// program's own value comes back once the handshake settled; a SYN sent again
// before that (a full backlog dropped the first) still carries the mark.
#pragma once

#include <sys/socket.h>

#include <cstddef>

namespace rdmashim::discovery {

inline constexpr int kMarkTtl = 255;

// What the client changed, to undo. Inactive when nothing was.
struct SynMark {
  int level = -1;  // SOL_IP or SOL_IPV6
  int name = 0;    // IP_TTL or IPV6_UNICAST_HOPS
  int was = 0;     // the program's value (what getsockopt said)
  bool active() const { return level >= 0; }
};

// Client, just before connect() to `dest` (same host): marks the SYN.
SynMark mark_syn(int fd, const sockaddr* dest, socklen_t len);
// Client, once the handshake settled: the program's TTL again.
void unmark_syn(int fd, SynMark* mark);

// Listener, before it takes connections: keeps incoming SYNs for us. False
// when the program keeps them itself (then they are its to read) or the
// kernel refuses.
bool keep_syns(int listener);

enum class SynSays { kUnknown, kMarked, kUnmarked };
// Server, on a socket accepted from a listener whose SYNs we keep: what its
// client's SYN said. Reads it, which frees it (a second read: kUnknown).
SynSays read_syn(int fd);
// The same, from the saved headers (IPv4 or IPv6, then TCP).
SynSays syn_says(const unsigned char* headers, size_t len);

}  // namespace rdmashim::discovery
