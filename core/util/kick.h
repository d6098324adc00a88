// A waiter's own wake-up call: an eventfd that another thread writes to
// bring a waiter asleep in the kernel back to user space, to look again.
//
// Why: a waiter asleep on a socket not on its ring yet counts on the TCP
// edge of the peer's Switch to come back and arm the ring. When another
// thread's read takes that Switch first, the kernel finds nothing readable
// and sleeps on without returning, and the peer's bytes on the ring ring no
// doorbell. Such a waiter leaves its kick with the connection
// (Connection::watch_switch); taking the Switch rings it.
#pragma once

#include <atomic>
#include <memory>

#include "util/unique_fd.h"

namespace rdmashim {

class Kick {
 public:
  // Whose it is, which decides where its descriptor may go (fd_budget.h):
  // an epoll set's anywhere keep() allows; a thread's as keep_for_thread().
  enum class Owner { kEpollSet, kThread };
  // Null under a seccomp filter (eventfd may be refused, fatally) or when
  // no descriptor of ours fits: the waiter then does without.
  static std::shared_ptr<Kick> make(Owner owner);
  ~Kick();
  // In a forked child: the parent's other threads' kicks are not ours to count.
  static void after_fork_child();

  int fd() const { return fd_.get(); }
  // Counts the waiters asleep on it (+1 before a sleep's watch_switch
  // calls, -1 after it): a kick nobody sleeps on is not rung.
  void asleep(int delta) { asleep_.fetch_add(delta, std::memory_order_seq_cst); }
  void ring();
  // For a level-triggered waiter (poll), after it saw the kick readable.
  void drain();

 private:
  UniqueFd fd_;
  bool in_range_ = false;  // a thread's, in the program's range (counted)
  int generation_ = 0;     // the fork generation that made it: only its own counts
  std::atomic<int> asleep_{0};
};

}  // namespace rdmashim
