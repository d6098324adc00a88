// What every hook family shares: the real calls, the errno convention, and
// finding the connection behind a descriptor.
#pragma once

#include <cerrno>
#include <string>
#include <vector>

#include "fd_table.h"
#include "sys/sys.h"

namespace rdmashim::preload {

// The real calls, resolved (as the next definition after us) on first use,
// which may be before our constructor ran.
const sys::Table& real();

// Core calls return a count or a negative errno; hooks return -1 and set errno.
template <typename T>
inline T syscall_result(T r) {
  if (r < 0) {
    errno = static_cast<int>(-r);
    return -1;
  }
  return r;
}

// The upgraded-or-upgradable connection behind fd, with a reference held, or
// empty when fd is plain (then the hook calls the real function). Completes
// a pending non-blocking connect first, if that is what fd is.
Ref active_stream(int fd);

// A listener this process inherited through fork (accept(), epoll_ctl ADD):
// answers RDMA-CM probes from here, or once its holder has gone.
void take_over_listener(Entry& listener);

// Starts tracking a connected client socket (sends the Hello if its peer
// advertised rdmashim on this host, as asked before connecting). `peer` is
// where it connected, at `connected_ns` (now_ns()).
void track_client(int fd, const sockaddr* peer, socklen_t len, bool advertised, discovery::Announcement announce,
                  const discovery::RemoteProbe& remote, uint64_t connected_ns);

// Starts tracking an accepted socket handed over across exec (hooks_process.cc).
// All names must be one socket (checked); the first becomes the connection's.
// With a state from Connection::describe_for_exec() the connection continues
// on its ring; without, it starts as a fresh accepted socket.
// fd is about to be closed while rdmashim keeps its socket open (a client
// held for its Ack, conn/deferred_close.h): the kernel drops a socket from
// every epoll set only at its last close, so we do it here, or the sets
// would report it, with the program's data, after the program closed it.
void forget_in_epoll_sets(int fd, bool lingering_only = false);
void adopt_socket(const std::vector<int>& names, const std::string& state);
void adopt_inherited();

// Notes a seccomp filter (or no_new_privs) in force when we load (hooks_sandbox.cc).
void detect_inherited_sandbox();

}  // namespace rdmashim::preload
