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
//   - a wait on a software RDMA link (rxe, siw) whose recent sleeps were
//     answered soon but woken late (through the provider's CQ event: 100-
//     300 us in a TCG guest) spins longer, up to 4x the budget: spinning
//     about as long as a sleep costs is never worse than twice the best
//     choice (the competitive rule), and there every wait that spun 50 us
//     and then slept cost a sixth of a ping-pong's rate. Sleeps answered
//     later than that bring the budget back down. Only there: on shared
//     memory beside CPU hogs the longer spins lost their CPU and made every
//     message sleep (bench/never_worse, "2 hogs, default spin").
// RDMASHIM_SPIN_US is the budget; 0 never spins, and neither does a
// sandboxed process (util/process.h: the loops call sched_yield, which a
// seccomp filter may forbid).
// Clock reads: the per-thread bookkeeping (idle reset, crowding) uses the
// coarse clock (never a system call). Where the precise clock is a system
// call and a device read (a VM whose clocksource is hpet or acpi_pm,
// measured once per process), it is first read at the first keep_going()
// and not after a yield: a wait answered within its first turns reads no
// clock at all, and a preemption shows only once the clock runs.
#pragma once

#include <cstdint>

namespace rdmashim {

// Tests: 1 as if now_ns() were cheap here, 0 as if not, -1 measure again.
void spin_clock_for_test(int cheap);

class Spinner {
 public:
  // Decides for this wait; deadline_ns (now_ns() clock, 0: none) caps it.
  // learns: a wait on a software RDMA link, whose sleeps' cost may lengthen
  // its spin (slept()).
  explicit Spinner(uint64_t deadline_ns = 0, bool learns = false);
  // Whether a Spinner made now would spin, without making one (which takes
  // a turn of the backoff): a wait that will not spin can go to sleep at
  // once, its sleep being its first look (preload's poll and epoll hooks).
  static bool would_spin();
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
  // Gives the core to a peer whose last wait was on this CPU (it answers
  // only when we let it run). The time away is its answer, unless it lasts
  // over 1 ms (keep_going's rule after a yield): then another thread had
  // the core (a CPU hog takes a whole time slice), a preemption.
  void yield_to_peer();
  // The condition came true (while spinning, or before sleeping).
  void found();
  // Whether slept() is wanted: a learning wait that may spin at all.
  bool learns() const { return learns_; }
  // The wait slept and was woken by its answer after ns: teaches the
  // thread what a sleep costs (the budget rule above).
  void slept(uint64_t ns);

 private:
  void finish(bool found);
  void start_clock(uint64_t now);
  uint64_t budget_ns_ = 0, deadline_ = 0;
  uint64_t end_ = 0, last_ = 0;  // now_ns() clock; 0 until first read
  bool spinning_ = false, attempted_ = false, preempted_ = false, recorded_ = false;
  bool yielded_ = false;  // since the last clock read
  bool learns_ = false;
};

}  // namespace rdmashim
