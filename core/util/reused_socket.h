// A socket rdmashim opens once per process and reuses for short questions:
// sock_diag queries, connect() probes of abstract names. Opening and closing
// one per question cost more than the question (a server that speaks first
// spent 20-26 µs per plain client on them, 13 µs with the sockets reused).
//
// One user at a time: a second (another thread, or a signal handler whose
// thread was in the middle of a question) gets a socket of its own for that
// question, as before. The shared one is one of ours (fd_budget.h), out of
// the program's numbers, so the program cannot close it; where there is no
// room for it, every question opens its own. A forked child opens its own
// (on the parent's copy either process could read the other's answers); one
// forked while another thread held the socket opens one per question. If
// the program dup2()ed a descriptor onto our number, it is the program's.
// Nothing is reused under a seccomp filter, nor once a thread of the process
// moved to another network namespace (setns, unshare: per thread, and the
// abstract names a socket reaches and the sockets sock_diag answers about
// are those of the namespace it was opened in); asking /proc which
// namespace a thread is in would cost more than a new socket.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <utility>

namespace rdmashim {

class ReusedSocket {
 public:
  constexpr ReusedSocket(int domain, int type, int protocol) : domain_(domain), type_(type), protocol_(protocol) {}
  ReusedSocket(const ReusedSocket&) = delete;
  ReusedSocket& operator=(const ReusedSocket&) = delete;

  // The use of one socket for one question; -1 if none could be opened.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept
        : fd_(std::exchange(o.fd_, -1)), from_(std::exchange(o.from_, nullptr)), discarded_(o.discarded_) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease();
    int fd() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    // The question left state on the socket that the next one must not meet
    // (an unread answer, a connection we could not undo): close it.
    void discard() { discarded_ = true; }

   private:
    friend class ReusedSocket;
    Lease(int fd, ReusedSocket* from) : fd_(fd), from_(from) {}
    int fd_ = -1;
    ReusedSocket* from_ = nullptr;  // null: a socket of this lease's own
    bool discarded_ = false;
  };

  Lease lease();

  // setns()/unshare() of a network namespace (preload/hooks_namespace.cc):
  // from now on no ReusedSocket of this process is reused.
  static void stop_after_namespace_move();

 private:
  bool still_ours(pid_t self);  // busy_ held
  void give_back(bool discard);

  const int domain_, type_, protocol_;
  std::atomic<bool> busy_{false};
  int fd_ = -1;  // these only while busy_ is held
  ino_t inode_ = 0;
  pid_t owner_ = 0;
  pid_t gave_up_in_ = 0;  // the process that found no room to keep one
};

}  // namespace rdmashim
