#include "util/spin.h"

#include <sys/resource.h>

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
};
thread_local SpinState t_spin;

constexpr uint64_t kIdleResetNs = 5'000'000;  // a thread quiet this long starts afresh
constexpr uint64_t kPreemptedNs = 20'000;     // a gap this long between two turns: we lost the CPU
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

}  // namespace

Spinner::Spinner(uint64_t deadline_ns) {
  uint32_t budget_us = config().spin_us;
  start_ = last_ = now_ns();
  SpinState& s = t_spin;
  if (start_ - s.last_wait_ns > kIdleResetNs) s.skip = s.backoff = 0;
  s.last_wait_ns = start_;
  end_ = start_ + uint64_t{budget_us} * 1000;
  if (deadline_ns != 0 && deadline_ns < end_) end_ = deadline_ns;
  // Sandboxed (a seccomp filter in force or coming): no spinning at all,
  // since the spin loops yield the core, a call the filter may forbid.
  if (budget_us == 0 || sandbox() != Sandbox::kNone) {
    recorded_ = true;  // nothing to learn
    return;
  }
  if (start_ - s.sample_ns >= kSampleNs) sample_crowding(s, start_);
  if (start_ < s.crowded_until_ns && start_ + kCrowdedSpinNs < end_) end_ = start_ + kCrowdedSpinNs;
  if (s.skip > 0) {
    --s.skip;
    return;
  }
  spinning_ = attempted_ = end_ > start_;
}

void Spinner::yielded() {
  last_ = now_ns();
  ++t_spin.yields;
}

Spinner::~Spinner() {
  if (!recorded_) finish(false);
}

bool Spinner::keep_going() {
  uint64_t now = now_ns();
  if (now - last_ > kPreemptedNs) preempted_ = true;
  last_ = now;
  if (preempted_ || now >= end_) spinning_ = false;
  return spinning_;
}

void Spinner::found() {
  if (!recorded_) finish(true);
}

void Spinner::finish(bool found) {
  recorded_ = true;
  SpinState& s = t_spin;
  s.last_wait_ns = now_ns();
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
