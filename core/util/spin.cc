#include "util/spin.h"

#include <sched.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>

#include "util/config.h"
#include "util/misc.h"
#include "util/process.h"

namespace rdmashim {
namespace {

// Per thread: waits that sleep at once before the next try, the current
// backoff, and the crowding sample. No locks; one system call now and then.
struct SpinState {
  uint32_t skip = 0;
  uint32_t backoff = 0;
  uint64_t last_wait_ns = 0;
  uint64_t sample_ns = 0;      // when ru_nivcsw was last read
  long nivcsw = -1;            // what it said (-1: never read)
  uint64_t yields = 0;         // Spinner::yielded() calls: switches of our own making
  uint64_t yields_at_sample = 0;
  uint64_t crowded_until_ns = 0;
  uint64_t sleep_cost_ns = 0;  // 0: no sleep answered within reach yet
};
thread_local SpinState t_spin;

constexpr uint64_t kIdleResetNs = 5'000'000;  // a thread quiet this long starts afresh
constexpr uint64_t kPreemptedNs = 20'000;     // a gap this long between two turns: we lost the CPU
// ... or this long when the thread yielded to its provider in between (the
// provider's work is ours; a time slice given to another thread is longer).
constexpr uint64_t kPreemptedAfterYieldNs = 1'000'000;
constexpr uint32_t kMaxFailBackoff = 64;
constexpr uint32_t kMinPreemptBackoff = 8;
constexpr uint32_t kMaxPreemptBackoff = 512;
// Crowding, from the thread's own evidence: ru_nivcsw counts the times the
// kernel took the CPU from this thread for another runnable one. Read at
// most every kSampleNs (one getrusage: at most 500 a second per waiting
// thread, against one or more calls per message when it sleeps);
// kCrowdSwitches or more since the last read (if that was at most
// kSampleMaxNs ago) mean other threads want our cores: for kCrowdHoldNs a
// spin lasts at most kCrowdedSpinNs. That still catches a peer that runs
// on the other core right now (a ping-pong answers within a microsecond or
// two, a small HTTP request within about ten; 5 us did no better) but
// no longer waits for one that has to be scheduled first, which burns the
// CPU the peer and everyone else wait for, and the scheduler then makes our
// own wake-ups wait (the CPU we used counts against us).
constexpr uint64_t kSampleNs = 2'000'000;
constexpr uint64_t kSampleMaxNs = 50'000'000;
constexpr long kCrowdSwitches = 2;
constexpr uint64_t kCrowdHoldNs = 20'000'000;
constexpr uint64_t kCrowdedSpinNs = 15'000;
// A spin lasts at most this many times RDMASHIM_SPIN_US, however slow the
// wake-ups here (Spinner::slept).
constexpr uint64_t kMaxBudgetFactor = 4;

void sample_crowding(SpinState& s, uint64_t now) {
  int saved = errno;  // a hook leaves errno as the kernel would
  rusage ru;
  bool ok = getrusage(RUSAGE_THREAD, &ru) == 0;
  errno = saved;
  // A sched_yield that switched counts as involuntary: those were ours (a
  // provider working on our cores), not a crowd.
  long ours = static_cast<long>(s.yields - s.yields_at_sample);
  s.yields_at_sample = s.yields;
  if (ok && s.nivcsw >= 0 && now - s.sample_ns <= kSampleMaxNs && ru.ru_nivcsw - s.nivcsw - ours >= kCrowdSwitches) {
    s.crowded_until_ns = now + kCrowdHoldNs;
  }
  s.nivcsw = ok ? ru.ru_nivcsw : -1;
  s.sample_ns = now;
}

// Whether now_ns() is cheap here (a vDSO read: tsc, kvm-clock), measured
// once per process: where it is a system call and a device read (hpet,
// acpi_pm) a wait reads it only once it has lasted a while.
std::atomic<int> g_clock_cheap{-1};
constexpr uint64_t kCheapClockNs = 250;

bool clock_cheap() {
  int v = g_clock_cheap.load(std::memory_order_relaxed);
  if (RDMASHIM_LIKELY(v >= 0)) return v != 0;
  uint64_t t0 = now_ns(), t1 = t0;
  for (int i = 0; i < 4; ++i) t1 = now_ns();
  v = (t1 - t0) / 4 <= kCheapClockNs ? 1 : 0;
  g_clock_cheap.store(v, std::memory_order_relaxed);
  return v != 0;
}

}  // namespace

void spin_clock_for_test(int cheap) { g_clock_cheap.store(cheap, std::memory_order_relaxed); }

Spinner::Spinner(uint64_t deadline_ns, bool learns) : deadline_(deadline_ns) {
  uint32_t budget_us = config().spin_us;
  const uint64_t now = coarse_now_ns();
  SpinState& s = t_spin;
  if (now - s.last_wait_ns > kIdleResetNs) s.skip = s.backoff = 0;
  s.last_wait_ns = now;
  budget_ns_ = uint64_t{budget_us} * 1000;
  // Sandboxed (a seccomp filter in force or coming): no spinning at all,
  // since the spin loops yield the core, a call the filter may forbid.
  if (budget_us == 0 || sandbox() != Sandbox::kNone) {
    recorded_ = true;  // nothing to learn
    return;
  }
  learns_ = learns;
  if (learns && s.sleep_cost_ns > budget_ns_) budget_ns_ = s.sleep_cost_ns;  // at most kMaxBudgetFactor x (slept)
  if (now - s.sample_ns >= kSampleNs) sample_crowding(s, now);
  if (now < s.crowded_until_ns && kCrowdedSpinNs < budget_ns_) budget_ns_ = kCrowdedSpinNs;
  if (s.skip > 0) {
    --s.skip;
    return;
  }
  // A deadline may have passed already: that needs the precise clock now.
  if (deadline_ != 0 || clock_cheap()) start_clock(now_ns());
  spinning_ = attempted_ = end_ == 0 || end_ > last_;
}

void Spinner::start_clock(uint64_t now) {
  last_ = now;
  end_ = now + budget_ns_;
  if (deadline_ != 0 && deadline_ < end_) end_ = deadline_;
}

void Spinner::yielded() {
  if (last_ != 0 && clock_cheap()) last_ = now_ns();  // the gap after the yield is measured alone
  else yielded_ = true;
  ++t_spin.yields;
}

void Spinner::yield_to_peer() {
  ++t_spin.yields;
  sched_yield();
  yielded_ = true;  // keep_going judges the time away with the 1 ms rule
}

bool Spinner::would_spin() {
  if (config().spin_us == 0 || sandbox() != Sandbox::kNone) return false;
  const SpinState& s = t_spin;
  return s.skip == 0 || coarse_now_ns() - s.last_wait_ns > kIdleResetNs;
}

Spinner::~Spinner() {
  if (!recorded_) finish(false);
}

bool Spinner::keep_going() {
  uint64_t now = now_ns();
  if (last_ == 0) start_clock(now);  // the budget runs from the first look
  if (now - last_ > (yielded_ ? kPreemptedAfterYieldNs : kPreemptedNs)) preempted_ = true;
  yielded_ = false;
  last_ = now;
  if (preempted_ || now >= end_) spinning_ = false;
  return spinning_;
}

void Spinner::found() {
  if (!recorded_) finish(true);
}

void Spinner::slept(uint64_t ns) {
  // What a sleep costs: the shortest recent sleep that its answer ended,
  // among those a longer spin could have caught. A sleep answered later
  // than that reach says sleeping was right: back toward the plain budget.
  if (!learns_) return;
  const uint64_t base = uint64_t{config().spin_us} * 1000;
  SpinState& s = t_spin;
  const uint64_t reach = base * kMaxBudgetFactor;
  uint64_t& cost = s.sleep_cost_ns;
  if (ns > reach) {
    cost = cost <= base ? 0 : cost - (cost - base) / 8;
  } else if (cost == 0 || ns < cost) {
    cost = ns;
  } else {
    cost += (ns - cost) / 8;
  }
}

void Spinner::finish(bool found) {
  recorded_ = true;
  SpinState& s = t_spin;
  s.last_wait_ns = coarse_now_ns();
  if (preempted_) {
    s.backoff = s.backoff < kMinPreemptBackoff ? kMinPreemptBackoff : s.backoff * 2;
    if (s.backoff > kMaxPreemptBackoff) s.backoff = kMaxPreemptBackoff;
    s.skip = s.backoff;
  } else if (found && spinning_) {
    // The spin paid: spin on. The backoff decays slowly: a failed spin costs
    // the whole budget, a successful one saves a few microseconds, so
    // spinning must succeed most of the time to be worth it.
    s.skip = 0;
    s.backoff = s.backoff * 7 / 8;
  } else if (attempted_) {
    // Spun through the whole budget for nothing.
    s.backoff = s.backoff == 0 ? 1 : s.backoff * 2;
    if (s.backoff > kMaxFailBackoff) s.backoff = kMaxFailBackoff;
    s.skip = s.backoff;
  }
  spinning_ = false;
}

}  // namespace rdmashim
