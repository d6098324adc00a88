// Waiting: the doorbell rings only for a sleeper that waits for what was
// published, a woken sleeper drains it only when it was rung, and the
// per-thread spin decision (util/spin.h) learns from the thread's own waits
// without reading anything from /proc.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "conn/thread_epoll.h"
#include "shm/shm_link.h"
#include "util/misc.h"
#include "util/process.h"
#include "util/spin.h"

namespace rdmashim {
namespace {

// Longer than the spinner's idle reset (5 ms) as its coarse clock sees it:
// that clock lags a tick (4 ms here) behind after the CPU idled, so a 10 ms
// sleep read as 4 ms in 2 of 300 tries, and a test that slept 10 ms to be
// "fresh" failed now and then (CI, ASan).
constexpr useconds_t kPastIdleResetUs = 20'000;

using shm::Segment;
using shm::ShmLink;

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

// Two links over one segment, with doorbells as in production: one
// datagram socket each, connected to each other, non-blocking.
struct Pair {
  Pair() {
    int err = 0;
    auto seg = Segment::create(4096, &err);
    EXPECT_NE(seg, nullptr) << err;
    auto other = Segment::attach(UniqueFd(fcntl(seg->memfd(), F_DUPFD_CLOEXEC, 0)), 4096, &err);
    EXPECT_NE(other, nullptr) << err;
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    server = std::make_unique<ShmLink>(std::move(seg), shm::LocalPage::create(&err), UniqueFd(sv[0]), shm::kServer);
    client = std::make_unique<ShmLink>(std::move(other), shm::LocalPage::create(&err), UniqueFd(sv[1]), shm::kClient);
  }
  shm::SegmentHeader& header() { return *server->segment().header(); }
  std::unique_ptr<ShmLink> server, client;
};

TEST(Doorbell, ReaderIsNotRungWhenThePeerConsumes) {
  Pair p;
  p.client->prepare_sleep(Link::kWaitData);
  p.server->publish_head(64);  // the server consumed: news for a writer only
  EXPECT_FALSE(readable(p.client->wait_fd())) << "a reader waiting for data was woken by a head";
  p.server->publish_tail(64);
  EXPECT_TRUE(readable(p.client->wait_fd()));
  p.client->finish_sleep(Link::kWaitData, true);
  EXPECT_FALSE(readable(p.client->wait_fd())) << "the last sleeper out drains a rung doorbell";
}

TEST(Doorbell, WriterIsRungByHeadOnly) {
  Pair p;
  p.client->prepare_sleep(Link::kWaitSpace);
  p.server->publish_tail(64);
  EXPECT_FALSE(readable(p.client->wait_fd())) << "a writer waiting for space was woken by a tail";
  p.server->publish_head(64);
  EXPECT_TRUE(readable(p.client->wait_fd()));
  p.client->finish_sleep(Link::kWaitSpace, true);
  // Nobody sleeps now: publishing rings nothing (no system call).
  p.server->publish_tail(128);
  p.server->publish_head(128);
  EXPECT_FALSE(readable(p.client->wait_fd()));
}

TEST(Doorbell, BothDirectionsAndUndrainedRing) {
  Pair p;
  p.client->prepare_sleep(Link::kWaitAny);
  p.server->publish_head(64);
  EXPECT_TRUE(readable(p.client->wait_fd()));
  // Woken by something else (rung: false), or the ring landed after the
  // sleeper looked: the peer counted it, so the last sleeper out drains it.
  p.client->finish_sleep(Link::kWaitAny, false);
  EXPECT_FALSE(readable(p.client->wait_fd())) << "a counted ring stayed queued";
  // A datagram the peer did not count (a flood) is drained when seen.
  unsigned char one = 1;
  ASSERT_EQ(write(p.server->wait_fd(), &one, 1), 1);
  p.client->prepare_sleep(Link::kWaitData);
  p.client->finish_sleep(Link::kWaitData, false);
  EXPECT_TRUE(readable(p.client->wait_fd())) << "not rung, not counted: left for a later sleep";
  p.client->prepare_sleep(Link::kWaitData);
  p.client->finish_sleep(Link::kWaitData, true);
  EXPECT_FALSE(readable(p.client->wait_fd()));
}

// A sleep is rung once, however often the peer publishes meanwhile: a
// datagram per publish would only fill the queue.
TEST(Doorbell, OneRingPerSleep) {
  Pair p;
  p.client->prepare_sleep(Link::kWaitData);
  for (uint64_t t = 64; t <= 640; t += 64) p.server->publish_tail(t);
  unsigned char buf[16];
  EXPECT_EQ(read(p.client->wait_fd(), buf, sizeof buf), 1);
  EXPECT_FALSE(readable(p.client->wait_fd())) << "rung more than once for one sleep";
  p.client->finish_sleep(Link::kWaitData, false);
  p.client->prepare_sleep(Link::kWaitData);  // a new sleep is rung again
  p.server->publish_tail(704);
  EXPECT_TRUE(readable(p.client->wait_fd()));
  p.client->finish_sleep(Link::kWaitData, true);
  EXPECT_FALSE(readable(p.client->wait_fd()));
}

// Issue 12: the peer writes our side of the segment. Scribbling our
// sleeper word must not stop us draining (a doorbell left readable would
// make every later wait return at once: a spin).
TEST(Doorbell, PeerScribbledSleeperWordStillDrains) {
  Pair p;
  p.client->prepare_sleep(Link::kWaitData);
  p.header().side[shm::kClient].sleepers.store(~uint64_t{0});  // the peer lies about our sleepers
  p.header().side[shm::kServer].rings.store(uint64_t{1} << 62);  // and about its rings
  p.server->publish_tail(64);
  ASSERT_TRUE(readable(p.client->wait_fd()));
  p.client->finish_sleep(Link::kWaitData, true);
  EXPECT_FALSE(readable(p.client->wait_fd())) << "our drain depended on a word the peer can write";
}

// Issue 12: a peer that never drains its doorbell and keeps announcing new
// sleeps cannot make our rings block: the queue fills, the writes fail.
TEST(Doorbell, PeerThatNeverDrainsCannotBlockUs) {
  Pair p;
  int peer_bell = p.client->wait_fd();
  fcntl(peer_bell, F_SETFL, fcntl(peer_bell, F_GETFL) & ~O_NONBLOCK);  // the peer's own end: blocking
  auto& word = p.header().side[shm::kClient].sleepers;
  uint64_t t0 = now_ns();
  for (uint64_t i = 1; i <= 20000; ++i) {
    word.store((i << 32) | 0x10001);  // a new sleep each time, waiting for everything
    p.server->publish_tail(i * 64);
    p.server->publish_head(0);
  }
  EXPECT_LT(now_ns() - t0, 5'000'000'000ull) << "the rings were slow";
  EXPECT_TRUE(readable(peer_bell));
}

// Issue 12: our own positions (readiness compares them with the peer's,
// a forked sibling resyncs from them) are not the segment's copy, which
// the peer can rewrite.
TEST(Doorbell, OwnCursorsAreNotThePeers) {
  Pair p;
  p.client->publish_head(64);
  p.client->publish_tail(128);
  auto& side = p.header().side[shm::kClient];
  side.consumed.value.store(64 + 1000);
  side.produced.value.store(7);
  side.produced.map.store(~uint64_t{0});
  EXPECT_EQ(p.client->own_head(), 64u);
  EXPECT_EQ(p.client->own_tail(), 128u);
  EXPECT_EQ(p.client->own_map(), 0u);
}

// Two waiters the scheduler put on one CPU see each other through the
// segment (then each spin yields at every turn), and only then: a CPU the
// peer has not waited on, or one sched_getcpu could not tell, is not it.
TEST(Doorbell, WaitersOnOneCpuSeeEachOther) {
  Pair p;
  EXPECT_FALSE(p.client->waits_beside_peer(3));  // the server never waited
  EXPECT_TRUE(p.server->waits_beside_peer(3));
  EXPECT_EQ(p.header().side[shm::kServer].cpu.load(), 4);  // the CPU + 1
  EXPECT_FALSE(p.server->waits_beside_peer(4));  // we moved; the client did not
  EXPECT_TRUE(p.client->waits_beside_peer(4));
  EXPECT_FALSE(p.client->waits_beside_peer(-1));
  EXPECT_EQ(p.header().side[shm::kClient].cpu.load(), 5);  // -1 published nothing
}

// One wait that spins until the budget runs out (nothing comes).
bool failed_wait() {
  Spinner s;
  bool spun = s.spinning();
  while (s.spinning()) s.keep_going();
  return spun;
}

// An edge-triggered sleeper (EPOLLET: woken by each new ring) leaves rings
// queued and drains them in one batch once they pile up; a poll() sleeper,
// woken by any queued ring, drains every one.
TEST(Doorbell, EdgeSleepsDrainInBatches) {
  Pair p;
  int queued = 0;
  uint64_t tail = 0;
  for (int i = 0; i < 80 && (queued == 0 || readable(p.client->wait_fd())); ++i) {
    p.client->prepare_sleep(Link::kWaitData);
    p.server->publish_tail(tail += 64);
    p.client->finish_edge_sleep(Link::kWaitData);
    ++queued;
  }
  EXPECT_FALSE(readable(p.client->wait_fd())) << "80 edge sleeps and their rings still queued";
  EXPECT_GT(queued, 2) << "an edge sleeper drained as often as a poll() sleeper";
  EXPECT_LE(queued, 32) << "more rings left queued than one batch reads";
  for (int i = 0; i < 3; ++i) {
    p.client->prepare_sleep(Link::kWaitData);
    p.server->publish_tail(tail += 64);
    p.client->finish_edge_sleep(Link::kWaitData);
  }
  ASSERT_TRUE(readable(p.client->wait_fd()));
  p.client->prepare_sleep(Link::kWaitData);
  p.client->finish_sleep(Link::kWaitData, true);
  EXPECT_FALSE(readable(p.client->wait_fd())) << "a poll() sleeper left queued rings readable";
}

// A thread asleep all through a long transfer (a reader waiting for the
// next request) while another sleeps for credit again and again: the rings
// for the second must not fill the queue (the peer's send buffer), and
// what the first may be owed stays readable.
TEST(Doorbell, AnotherSleeperDoesNotLetTheQueueFill) {
  Pair p;
  p.client->prepare_sleep(Link::kWaitData);  // asleep throughout
  uint64_t head = 0;
  for (int i = 0; i < 200; ++i) {
    p.client->prepare_sleep(Link::kWaitSpace);
    p.server->publish_head(head += 64);
    if (i % 2) {
      p.client->finish_edge_sleep(Link::kWaitSpace);
    } else {
      p.client->finish_sleep(Link::kWaitSpace, true);
    }
    uint64_t queued = p.header().side[shm::kServer].rings.load() - p.client->local().drained.load();
    ASSERT_LE(queued, 32u) << "after " << i + 1 << " sleeps";
    ASSERT_TRUE(readable(p.client->wait_fd())) << "drained what a sleeper may be owed";
  }
  p.client->finish_edge_sleep(Link::kWaitData);
}

// The peer's ring count is the peer's: a lie sends a batch drain to an
// empty queue, which stops there.
TEST(Doorbell, EdgeDrainStopsAtAnEmptyQueue) {
  Pair p;
  p.header().side[shm::kServer].rings.store(uint64_t{1} << 62);
  p.client->prepare_sleep(Link::kWaitData);
  p.server->publish_tail(64);
  p.client->finish_edge_sleep(Link::kWaitData);
  EXPECT_FALSE(readable(p.client->wait_fd()));
}

// A thread's own epoll (conn/thread_epoll.h): a connection is registered at
// the second sleep in a row on it, a sleep wakes on its doorbell's edge
// without draining, and a connection left behind wakes nobody.
TEST(ThreadEpoll, RegistersAtTheSecondSleepAndSleepsThroughOthers) {
  std::thread([] {
    int a[2], b[2], tcp[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, a), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, b), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, tcp), 0);
    unsigned char one = 1;
    {
      thread_epoll::Sleep first(1, a[0], tcp[0], POLLIN);
      EXPECT_FALSE(first.active()) << "registered at the first sleep";
    }
    {
      thread_epoll::Sleep again(1, a[0], tcp[0], POLLIN);
      ASSERT_TRUE(again.active());
      thread_epoll::Sleep nested(1, a[0], tcp[0], POLLIN);
      EXPECT_FALSE(nested.active()) << "a signal handler's sleep changed the registration under ours";
      ASSERT_EQ(write(a[1], &one, 1), 1);
      pollfd p[2] = {{a[0], POLLIN, 0}, {tcp[0], POLLIN, 0}};
      EXPECT_EQ(again.wait(p, 1000), 1);
      EXPECT_EQ(p[0].revents, POLLIN);
      EXPECT_EQ(p[1].revents, 0);
      // The ring stays queued (nobody drained): no new edge, no wakeup.
      EXPECT_EQ(again.wait(p, 20), 0);
      ASSERT_EQ(write(tcp[1], &one, 1), 1);
      EXPECT_EQ(again.wait(p, 1000), 1);
      EXPECT_EQ(p[1].revents, POLLIN);
      ASSERT_EQ(read(tcp[0], &one, 1), 1);  // else it wakes the next registration at once
    }
    for (int i = 0; i < 2; ++i) thread_epoll::Sleep(2, b[0], tcp[0], POLLIN);
    {
      thread_epoll::Sleep other(2, b[0], tcp[0], POLLIN);
      ASSERT_TRUE(other.active());
      ASSERT_EQ(write(a[1], &one, 1), 1);  // the first connection's doorbell
      pollfd p[2] = {{b[0], POLLIN, 0}, {tcp[0], POLLIN, 0}};
      EXPECT_EQ(other.wait(p, 20), 0) << "woken by a connection no longer registered";
    }
    for (int fd : {a[0], a[1], b[0], b[1], tcp[0], tcp[1]}) close(fd);
  }).join();
}


TEST(Spin, FreshThreadSpinsAndBacksOffExponentially) {
  std::thread([] {
    EXPECT_TRUE(failed_wait()) << "a fresh thread gets the fast path";
    // A failed spin makes the next waits sleep at once (1, 2, 4 ... after a
    // plain failure; 8 or more if the spin also lost its CPU, which a loaded
    // machine may do to this test), then one tries again, later each time.
    int last = 0;
    for (int round = 0; round < 3; ++round) {
      int skipped = 0;
      while (!failed_wait() && skipped <= 600) ++skipped;
      EXPECT_GE(skipped, 1) << "round " << round;
      EXPECT_LE(skipped, 600) << "round " << round << ": never tried again";
      EXPECT_GE(skipped, last) << "round " << round << ": the backoff shrank after a failure";
      last = skipped;
    }
    // Successes shrink the backoff.
    for (int i = 0; i < 8; ++i) failed_wait();
    for (;;) {  // skipped waits change nothing; the next spin finds its answer
      Spinner s;
      if (s.spinning()) {
        s.found();
        break;
      }
    }
    Spinner after;
    EXPECT_TRUE(after.spinning()) << "spinning that paid goes on";
    after.found();
  }).join();
}

TEST(Spin, PreemptionBacksOffAndIdleResets) {
  std::thread([] {
    {
      Spinner s;
      ASSERT_TRUE(s.spinning());
      usleep(1000);  // as if the scheduler took the CPU away mid-spin
      EXPECT_FALSE(s.keep_going());
    }
    for (int i = 0; i < 8; ++i) {
      Spinner s;
      EXPECT_FALSE(s.spinning()) << "a preempted spinner sleeps at once for a while (turn " << i << ")";
    }
    usleep(kPastIdleResetUs);  // quiet for longer than the idle reset
    Spinner s;
    EXPECT_TRUE(s.spinning()) << "a thread back from idle gets the fast path";
    s.found();
  }).join();
}

// Where now_ns() is a system call (a VM on hpet), a wait reads it only from
// its first keep_going(): the budget, a passed deadline and a preemption
// are still honoured from there, and a yield to the provider is not taken
// for a preemption unless the gap is a time slice.
TEST(Spin, SlowClockIsReadOnlyOnceTheWaitLasts) {
  std::thread([] {
    spin_clock_for_test(0);
    // The longest of a few spins (a busy machine may preempt one, which
    // rightly ends it early) lasts the budget, and not much more.
    uint64_t longest = 0;
    for (int i = 0; i < 5; ++i) {
      usleep(kPastIdleResetUs);  // back to a fresh thread's state
      Spinner s;
      ASSERT_TRUE(s.spinning());
      uint64_t t0 = now_ns();
      while (s.keep_going()) cpu_relax();
      EXPECT_LT(now_ns() - t0, uint64_t{500'000'000}) << "the budget ends the spin";
      longest = std::max(longest, now_ns() - t0);
    }
    EXPECT_GE(longest, uint64_t{config().spin_us} * 1000 * 9 / 10) << "the whole budget is spun";
    usleep(10'000);
    {
      Spinner s(now_ns() - 1);
      EXPECT_FALSE(s.spinning()) << "a deadline already passed: no spin";
    }
    // How many waits sleep at once before one spins again: 1 after a spin
    // that ran out of budget, 8 or more after one that lost its CPU.
    auto skips_after = [](bool yield, useconds_t gap) {
      usleep(kPastIdleResetUs);  // idle: a fresh start
      {
        Spinner s;
        EXPECT_TRUE(s.keep_going());  // the clock starts
        if (yield) s.yielded();
        usleep(gap);
        EXPECT_FALSE(s.keep_going());  // past the budget, preempted or not
      }
      for (int n = 0; n < 1000; ++n) {
        Spinner s;
        if (s.spinning()) {
          s.found();
          return n;
        }
      }
      return 1000;
    };
    // A 300 us sleep on a loaded machine can last past the 1 ms a yield is
    // allowed (the quick suite's -j2 did): only a gap that stayed under it
    // says anything, so look at the best of a few.
    int fewest = 1000;
    for (int i = 0; i < 5 && fewest >= 8; ++i) fewest = std::min(fewest, skips_after(true, 300));
    EXPECT_LT(fewest, 8) << "a yield's gap is not a preemption";
    EXPECT_GE(skips_after(true, 3000), 8) << "a time slice given away is one, yield or not";
    EXPECT_GE(skips_after(false, 300), 8) << "a preemption once the clock runs";
    spin_clock_for_test(-1);
  }).join();
}

// A wait on a software RDMA link whose sleeps are answered soon but woken
// late (a VM's slow wake-ups) spins longer, up to 4x the budget; sleeps
// answered later than that bring it back to the plain budget. Other waits
// (shared memory) keep the plain budget.
TEST(Spin, SlowWakeupsLengthenTheSpin) {
  std::thread([] {
    const uint64_t base = uint64_t{config().spin_us} * 1000;
    auto spin_ns = [](bool learns = true) {  // one wait with nothing coming, as long as it spins
      usleep(kPastIdleResetUs);  // a fresh start: no backoff
      Spinner s(0, learns);
      uint64_t t0 = now_ns();
      while (s.keep_going()) cpu_relax();
      return now_ns() - t0;
    };
    auto longest_of = [&](int n) {
      uint64_t longest = 0;
      for (int i = 0; i < n; ++i) longest = std::max(longest, spin_ns());
      return longest;
    };
    auto teach = [](uint64_t ns, int times) {
      for (int i = 0; i < times; ++i) {
        Spinner s(0, true);
        ASSERT_TRUE(s.learns());
        s.found();
        s.slept(ns);
      }
    };
    teach(base * 3, 4);  // answered 150 us into each sleep
    uint64_t longer = longest_of(5);
    EXPECT_GE(longer, base * 3 * 9 / 10) << "a sleep costs 3 budgets here: spin about that long";
    EXPECT_LT(longer, base * 4 * 20) << "far past the cap";
    uint64_t plain = UINT64_MAX;
    for (int i = 0; i < 5; ++i) plain = std::min(plain, spin_ns(false));
    EXPECT_LT(plain, base * 2) << "a wait that does not learn keeps the plain budget";
    teach(base * 40, 40);  // answered long after: sleeping was right
    // The shortest of a few (a preemption can only shorten a spin, a long
    // one is this machine's noise).
    uint64_t shortest = UINT64_MAX;
    for (int i = 0; i < 5; ++i) shortest = std::min(shortest, spin_ns());
    EXPECT_LT(shortest, base * 2) << "back to the plain budget";
    teach(base * 100, 1);  // far out of reach: nothing learnt
    teach(base / 2, 1);    // quicker than the budget: the plain budget stands
    shortest = UINT64_MAX;
    for (int i = 0; i < 5; ++i) shortest = std::min(shortest, spin_ns());
    EXPECT_LT(shortest, base * 2);
  }).join();
}

// Crowding (issue 11): a thread the kernel keeps taking the CPU from (its
// ru_nivcsw grows) spins only briefly: a peer running on the other core
// still answers within that, one that must be scheduled first is slept for.
TEST(Spin, CrowdedThreadSpinsOnlyBriefly) {
  std::thread([] {
    cpu_set_t allowed;
    ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    // A busy sibling on the same CPU: for 30 ms the two take turns.
    std::atomic<bool> stop{false}, started{false};
    std::thread hog([&] {
      sched_setaffinity(0, sizeof one, &one);
      started.store(true);
      while (!stop.load(std::memory_order_relaxed)) cpu_relax();
    });
    while (!started.load()) sched_yield();
    {
      // The thread's first look at its counter, just before: a look longer
      // than 50 ms ago would say nothing (a busy machine may take that long
      // to start the sibling).
      Spinner first;
      first.found();
    }
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    for (uint64_t t0 = now_ns(); now_ns() - t0 < 30'000'000;) cpu_relax();
    getrusage(RUSAGE_THREAD, &after);
    stop.store(true);
    hog.join();
    if (after.ru_nivcsw - before.ru_nivcsw < 2) GTEST_SKIP() << "the kernel never took the CPU from this thread";
    // Every spin with nothing coming used to last its whole budget (50 us),
    // or until a preemption (a gap over 20 us): one of these must stop
    // within 20 us (a few tries: this machine may preempt us too).
    uint64_t shortest = UINT64_MAX;
    for (int i = 0; i < 100 && shortest >= 20'000; ++i) {
      Spinner s;
      if (!s.spinning()) continue;
      uint64_t t = now_ns();
      while (s.spinning()) s.keep_going();
      shortest = std::min(shortest, now_ns() - t);
    }
    EXPECT_LT(shortest, 20'000u) << "a crowded thread still spins its whole budget";
  }).join();
}

// Under a seccomp filter (in force or coming) a thread never spins: the
// spin loops call sched_yield, which the filter may forbid.
TEST(Spin, SandboxedNeverSpins) {
  std::thread([] {
    {
      Spinner fresh;
      ASSERT_TRUE(fresh.spinning()) << "a fresh thread spins when not sandboxed";
      fresh.found();
    }
    int saved = g_sandbox.load();
    for (Sandbox sb : {Sandbox::kInherited, Sandbox::kInstalling}) {
      g_sandbox.store(static_cast<int>(sb));
      usleep(kPastIdleResetUs);  // past the idle reset: a fresh thread's fast path
      for (int i = 0; i < 4; ++i) {
        Spinner s;
        EXPECT_FALSE(s.spinning()) << "sandbox " << static_cast<int>(sb) << ", turn " << i;
        s.found();  // success must not bring spinning back either
      }
    }
    g_sandbox.store(saved);
  }).join();
}

}  // namespace
}  // namespace rdmashim
