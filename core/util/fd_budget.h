// rdmashim's own descriptors, kept out of the program's way.
//
// A process may hold RLIMIT_NOFILE descriptors, and POSIX gives a new one
// the lowest free number. Descriptors rdmashim keeps (a connection's
// doorbells, its memfd while needed, the rendezvous and announcement
// sockets during a handshake, a listener's advertisement, the stats page)
// must neither make the program meet EMFILE sooner nor change the numbers
// its own calls return (select() users index fd_sets by them). keep() moves
// each one, right after it was created at the lowest free number:
//
//  - above the soft limit, when the hard limit leaves room and no seccomp
//    filter is (being) installed: the soft limit is raised for one
//    F_DUPFD_CLOEXEC and put back. Such numbers cost the program nothing:
//    it could only get them by raising its own limit first.
//  - otherwise into the top sixteenth of the program's range, and only
//    while the program's lowest free number stays below that zone. The
//    program then meets EMFILE at most L/16 descriptors sooner than on TCP.
//
// When neither fits, the caller gives up the upgrade: the connection stays
// on TCP with reason tcp:fd-budget.
#pragma once

#include <atomic>
#include <cerrno>

#include "util/unique_fd.h"

namespace rdmashim::fds {

// Moves fds[0..n) (each just created, close-on-exec) out of the program's
// numbers, leaving room for `later` more of ours. True: fds hold the new
// numbers (the old ones are closed). False: all n are closed and set to -1.
bool keep(int* fds, int n, int later = 0);
inline bool keep(UniqueFd& fd, int later = 0) {
  int v = fd.release();
  bool ok = keep(&v, 1, later);
  fd.reset(v);
  return ok;
}

// Like keep(), but only above the soft limit: for a descriptor that saves
// system calls and is not needed (a thread's own epoll), which in the
// program's range would take room a connection may need.
bool keep_above(UniqueFd& fd);

// Descriptors each thread keeps one of (its own epoll instance, its kick):
// above the soft limit, where the hard limit leaves room; else in the
// program's range for at most ThreadRange::kMax threads of the process per
// kind (more would take room a connection's doorbell needs), counted in
// `range`. `make` opens a new one (a descriptor keep_above() could not
// move is closed). True: fd holds it, and *in_range says whether it took a
// slot of range (given back with range.used.fetch_sub(1)).
struct ThreadRange {
  static constexpr int kMax = 4;
  std::atomic<int> used{0};
};
bool keep_for_thread(UniqueFd& fd, UniqueFd (*make)(), ThreadRange& range, bool* in_range);

// Descriptors a handshake in progress will ask keep() for later (the
// client's segment, after its Hello): counted against the room every other
// keep() must leave, from construction until reset() or destruction.
class Promise {
 public:
  Promise() = default;
  explicit Promise(int n);
  Promise(Promise&& o) noexcept : n_(o.n_) { o.n_ = 0; }
  Promise& operator=(Promise&& o) noexcept {
    if (this != &o) {
      reset();
      n_ = o.n_;
      o.n_ = 0;
    }
    return *this;
  }
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() { reset(); }
  void reset();

 private:
  int n_ = 0;
};

// Descriptors keep() placed are ours until fds::close() (UniqueFd does):
// the program's close_range()/closefrom() spare them (preload/hooks_socket.cc).
bool is_ours(int fd);
// Marks an inherited descriptor (adopted across exec) as ours.
void adopt(int fd);
// Forgets `fd` as ours without closing it: the program put a descriptor of
// its own at that number (dup2 onto it), which the kernel let it do.
void disown(int fd);
// Calls fn(a, b, ctx) for each maximal run [a, b] within [first, last] that
// holds none of ours, in order; stops at (and returns) a negative result.
int for_each_gap(unsigned first, unsigned last, int (*fn)(unsigned a, unsigned b, void* ctx), void* ctx);

// fork(): no raise of the limit may be under way when the child is made
// (it would keep the raised limit): held from the end of the prepare handler
// until the parent's and the child's handlers.
void hold_for_fork();
void release_after_fork();

// True if errno value `err` (negative or positive) says descriptors ran out.
inline bool exhausted(int err) { return err == -EMFILE || err == -ENFILE || err == EMFILE || err == ENFILE; }

}  // namespace rdmashim::fds
