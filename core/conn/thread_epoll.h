// A thread's own epoll instance for the blocking reads and writes that sleep
// on one connection again and again (a request-response loop).
//
// poll() on the doorbell and the TCP side costs a read after every wake-up:
// the doorbell is a datagram socket, readable until drained, so a blocking
// recv that slept cost three system calls per message (the peer's ring, our
// poll, our drain) where TCP's costs two. Registered edge-triggered, the
// doorbell wakes us once per ring and needs no drain; ShmLink reads what
// piles up in batches (finish_edge_sleep). A sleep is then one epoll_wait.
//
// Only where it cannot be in anyone's way:
//  - a thread registers a connection at its second sleep in a row on it, so
//    one that serves many connections in turn pays no epoll_ctl;
//  - never under a seccomp filter (sandbox()): a filter may allow poll only;
//  - never from a signal handler that interrupted the thread's own use (the
//    registration would change under the interrupted sleep);
//  - a forked child drops its copy (after_fork_child): the instance would be
//    its parent's too, and an edge one of them takes the other never sees;
//  - the descriptor is one of ours (fd_budget.h), close-on-exec, closed when
//    the thread exits, above the soft limit; where the hard limit leaves no
//    room there, in the top of the program's range for at most 4 threads of
//    the process (more would take room a connection's doorbell needs), and
//    the others poll.
// A vfork child must not sleep in our hooks (it runs only until exec).
#pragma once

#include <poll.h>

#include <cstdint>

namespace rdmashim::thread_epoll {

// A sleep on one connection's doorbell (`key`: Link::edge_key(), never
// reused) and TCP side. active() false: the caller polls as before.
class Sleep {
 public:
  Sleep(uint64_t key, int doorbell, int tcp, short tcp_events);
  ~Sleep();
  Sleep(const Sleep&) = delete;
  Sleep& operator=(const Sleep&) = delete;

  bool active() const { return epfd_ >= 0; }
  // As poll() on {doorbell POLLIN, tcp tcp_events}, filling p[0..1].revents:
  // the number with events, 0 at the timeout, -1 with errno (EINTR). Should
  // epoll_wait fail otherwise, it polls instead, and active() turns false.
  int wait(pollfd (&p)[2], int timeout_ms);

 private:
  int epfd_ = -1;
  uint64_t key_ = 0;
};

// In a forked child: this thread's instance is shared with the parent.
void after_fork_child();

}  // namespace rdmashim::thread_epoll
