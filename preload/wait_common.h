// What the poll family (hooks_poll.cc) and the epoll family (hooks_epoll.cc)
// share: deadlines in now_ns() nanoseconds (kForever: none), the checks of a
// caller's timespec, and the spin on the rings before sleeping.
#pragma once

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "conn/connection.h"
#include "util/kick.h"
#include "util/misc.h"
#include "util/spin.h"

namespace rdmashim::preload {

constexpr int64_t kForever = -1;

int64_t deadline_from_ms(int ms);
int64_t deadline_from_ts(const timespec* ts);
bool expired(int64_t dl);
int ms_left(int64_t dl);
timespec ts_left(int64_t dl);
bool bad_timespec(const timespec* ts);
// The earlier of a deadline and a connection's prefix deadline (0: none).
inline int64_t earliest(int64_t dl, uint64_t prefix) {
  if (prefix == 0) return dl;
  return dl == kForever || static_cast<int64_t>(prefix) < dl ? static_cast<int64_t>(prefix) : dl;
}

// How soon a sleeper looks again at a connection whose bytes another thread
// holds or left unread (Connection::settle_control, setup_read_elsewhere):
// their kernel edge is spent. Rare and brief.
constexpr uint64_t kUnsettledLookNs = 1'000'000;
inline int64_t look_again_soon(int64_t dl) { return earliest(dl, now_ns() + kUnsettledLookNs); }

// This thread's kick (util/kick.h) for the poll family's sleeps, taken at
// the first one that needs it from those of threads that exited, or made
// (Kick::Owner::kThread); null when none could be. Around fork the pool is
// held, and a child forgets the parent's kicks (release_kicks_after_fork).
std::shared_ptr<Kick> thread_kick();
void hold_kicks_for_fork();
void release_kicks_after_fork(bool child);

// About to sleep: idle elastic rings of this process give pages back
// (Connection::release_idle_memory). Returns the deadline to sleep until:
// dl, or earlier when a rate-limited release falls due before it.
int64_t release_before_sleep(int64_t dl);
// The same on the paths that pass straight to the kernel (no deadline cap).
inline void release_before_plain_sleep(bool may_sleep) {
  if (may_sleep && Connection::idle_memory_pending()) Connection::release_idle_memory(nullptr);
}

// Clients still connecting (non-blocking connect), their Hello due once
// connected (connecting.cc): a wait that holds one also watches it for
// writability, internally, so the Hello leaves as the connect completes
// even when the program waits for reading only.
struct EpollSet;
bool connecting_client(int fd);
// After its connect was reported done: the Hello goes out (or a failed
// connect's announcement is withdrawn). False if it still looks connecting.
bool settle_connecting(int fd);
// The connecting clients among an epoll set's native registrations, and
// those of the sets registered in it (not in `quiet`, not in `watch`
// already), appended to `watch` as {fd, POLLOUT}.
void connecting_natives(EpollSet& set, std::vector<pollfd>& watch, const std::vector<int>& quiet);
// The same for fd if it is an epoll set of ours (poll/select on a set).
void connecting_in_set(int fd, std::vector<pollfd>& watch, const std::vector<int>& quiet);
// fd is a connecting client, or an epoll set holding one: a wait on it must
// watch the connect.
bool watches_connect(int fd);
// Sleeps on the epoll set epfd (readable) and `watch` until one is ready, a
// signal or dl (poll, or ppoll with `mask`); settles the connects that
// completed (adding to `quiet` any that still look connecting). 0, or -1
// with errno (EINTR: a signal; else the caller sleeps on the set alone).
int sleep_with_connects(int epfd, std::vector<pollfd>& watch, int64_t dl, const sigset_t* mask,
                        std::vector<int>& quiet);

// Spins (never past the deadline) until ready() says so, while the
// thread's Spinner (util/spin.h) thinks spinning pays; kernel() is asked only
// every few hundred turns since it costs a system call. Peers on a ring
// answer in about a microsecond: catching that here saves the doorbell and
// two context switches. The caller passes the same Spinner on to its sleep
// and calls found() when that ends with something ready.
template <typename Ready, typename Kernel>
bool spin_for(Spinner& spin, Ready ready, Kernel kernel) {
  for (uint32_t i = 1; spin.spinning(); ++i) {
    if (ready()) {
      spin.found();
      return true;
    }
    if ((i & 255) == 0) {
      if (kernel()) {
        spin.found();
        return true;
      }
      if ((i & 4095) == 0) sched_yield();  // leave the core to a runnable peer
      if (!spin.keep_going()) return false;
    }
    cpu_relax();
  }
  return ready();
}
inline uint64_t spin_deadline(int64_t dl) { return dl == kForever ? 0 : static_cast<uint64_t>(dl); }

}  // namespace rdmashim::preload
