// A client that writes and closes without ever reading (a one-way sender,
// `nc -q0`) closes before its server's Ack came. On TCP its server never
// sends anything; here the Ack would land on a closed socket, whose kernel
// answers with RST, and the server would lose the bytes it had not read yet
// or see ECONNRESET where EOF was due. So the last close of such a socket
// keeps it: the socket is duplicated at a number of its own (close on exec,
// where util/fd_budget.h keeps ours: above the soft limit, so it costs the
// program no descriptor), shut down for writing (the FIN leaves exactly when close() would
// have sent it), and the program's number is closed and free at once. The
// held socket is closed once the Ack came (consumed first, so no RST), the
// server said on the rendezvous that no Ack follows (it saw our FIN first:
// Connection::handle_hello), the server closed or reset, application bytes
// came instead (TCP would reset there too), or the setup timeout passed.
//
// This list owns every held socket and rendezvous. It is looked at (never
// waited on) at later closes and new client connections, and waited on, up
// to each deadline, at exit and before exec (close-on-exec would drop them).
// A forked child closes its copies at once; the parent keeps owning them.
// Numbers the program closes or replaces are moved away first (close() of
// one of ours is EBADF, as it would be without rdmashim).
//
// The same list holds a verbs connection whose last close found its ring
// writes not all confirmed yet (Connection::Drain::kFlushing): its socket is
// duplicated the same way but not shut down, and a background thread looks
// at the flush every millisecond (every 10 ms after the setup timeout);
// once the writes landed, the peer is known gone or the deadline passed
// (Connection::linger_deadline: 30 s, for a reader away from its socket),
// the connection is let go and the duplicate closed, which sends the FIN
// the program's close() would have sent (a reset if writes are still
// unconfirmed: Connection::linger_step). So a peer host that stopped
// answering no longer holds close() (TCP's close returns at once too);
// exit and exec still wait for it, at most the setup timeout.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "util/unique_fd.h"

namespace rdmashim::deferred_close {

constexpr size_t kNonceBytes = 16;

// Takes over `fd` (the program closes its number right after) until the Ack
// for `nonce` came; `rendezvous` hears a refusal. The duplicate avoids
// [avoid_first, avoid_last] (a close_range the program is making). false:
// nothing held (no descriptor left, ...), the caller closes as before.
bool hold(int fd, const unsigned char (&nonce)[kNonceBytes], UniqueFd rendezvous, unsigned avoid_first,
          unsigned avoid_last);

// A connection finishing its flush: step(ctx, fd, last) looks once (true:
// nothing left to wait for; `last`: the deadline passed, this is the last
// look before the FIN), release(ctx) lets it go. Plain callbacks, as
// Link::PeerWatch (a close may run where a new vtable costs a system call).
struct Flushing {
  bool (*step)(void* ctx, int fd, bool last);
  void (*release)(void* ctx);
  void* ctx;
};
// Takes over `fd` and `what` until step() says done or `deadline` (now_ns())
// passed. false: nothing held (no descriptor or no thread), `what` is still
// the caller's, which finishes the flush itself.
bool hold_flushing(int fd, Flushing what, uint64_t deadline, unsigned avoid_first, unsigned avoid_last);

extern std::atomic<int> g_held;
inline bool any() { return g_held.load(std::memory_order_relaxed) != 0; }

// Closes what is done, without waiting.
void reap();
// Waits until every held socket is done or its deadline passed (exit,
// exec); a flush at most the setup timeout from now.
void finish_all();
// fd is one of ours: the program does not have it.
bool owns(int fd);
// The program is about to close or replace [first, last]: ours move away.
void vacate(unsigned first, unsigned last);
// In a forked child: the copies are the parent's to finish.
void after_fork_child();

}  // namespace rdmashim::deferred_close
