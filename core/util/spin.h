// Whether, and how long, a waiter spins before it sleeps on its doorbell.
//
// Spinning wins only when the peer runs on another core at the same time;
// on a busy machine a spinner steals the very CPU its peer needs. Rather
// than guess from a load average (which counts every process starting up,
// and costs a /proc read a sandbox may forbid), each thread learns from its
// own recent waits, with no /proc read and one cheap call now and then:
//   - a fresh thread, or one idle for a while, spins (the first request on a
//     new or long-quiet connection gets the fast path);
//   - a spin that ran out of budget backs off exponentially: the next 1, 2,
//     4 ... 64 waits sleep at once, then one tries again;
//   - a spin that found its answer spins again next time, and shrinks the
//     backoff by an eighth (a failure costs the whole budget, a success
//     saves a few microseconds: spinning must nearly always pay);
//   - a spin that lost its CPU (a gap between two clock reads far longer
//     than a turn of the loop: the machine is oversubscribed) backs off the
//     same way, from 8 up to 512 waits;
//   - a crowded thread (the kernel took its CPU for another one twice or
//     more since it last looked: getrusage's ru_nivcsw, read at most every
//     2 ms, the one system call here) spins at most 15 us for the next 20 ms:
//     long enough for a peer running on the other core right now, not for
//     one that first has to be scheduled.
// RDMASHIM_SPIN_US is the budget; 0 never spins, and neither does a
// sandboxed process (util/process.h: the loops call sched_yield, which a
// seccomp filter may forbid).
#pragma once

#include <cstdint>

namespace rdmashim {

class Spinner {
 public:
  // Decides for this wait; deadline_ns (now_ns() clock, 0: none) caps it.
  explicit Spinner(uint64_t deadline_ns = 0);
  Spinner(const Spinner&) = delete;
  Spinner& operator=(const Spinner&) = delete;
  // Records the outcome of the wait if nobody did.
  ~Spinner();

  bool spinning() const { return spinning_; }
  // Called every few turns while spinning: false once the budget is spent
  // or the thread was descheduled (then spinning() turns false).
  bool keep_going();
  // The thread gave its core away on purpose (sched_yield to a provider
  // that works on our cores): the time away is not a preemption.
  // Nor is the involuntary switch it may count (a yield leaves the thread
  // runnable): the crowding sample discounts it.
  void yielded();
  // The condition came true (while spinning, or before sleeping).
  void found();

 private:
  void finish(bool found);
  uint64_t start_ = 0, end_ = 0, last_ = 0;
  bool spinning_ = false, attempted_ = false, preempted_ = false, recorded_ = false;
};

}  // namespace rdmashim
