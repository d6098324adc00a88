// core/util/fd_budget: where rdmashim's own descriptors go (above the soft
// limit when the hard one leaves room, else the top sixteenth, else nowhere),
// that the program's next number is the one it would get without them, and
// that close_range()'s gaps skip them. Each case runs in a child: it changes
// the process's RLIMIT_NOFILE.
#include "util/fd_budget.h"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "in_child.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

namespace rdmashim {
namespace {

using test::in_child;

int next_number() {
  int fd = eventfd(0, EFD_CLOEXEC);
  close(fd);
  return fd;
}

TEST(FdBudget, AboveTheSoftLimitWhenTheHardOneLeavesRoom) {
  int r = in_child(64, 256, [] {
    int bad = 0;
    int before = next_number();
    UniqueFd fd(eventfd(0, EFD_CLOEXEC));
    bad += !fds::keep(fd);
    bad += fd.get() < 64;  // out of the program's range
    bad += !fds::is_ours(fd.get());
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    bad += lim.rlim_cur != 64 || lim.rlim_max != 256;  // put back
    bad += next_number() != before;                    // the program's next number is unchanged
    int n = fd.get();
    fd.reset();
    bad += fds::is_ours(n);
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(FdBudget, TopSixteenthWithoutRoomAboveAndNothingOnceTheProgramNearsIt) {
  if (geteuid() != 0) GTEST_SKIP() << "lowering the hard limit in a child needs nothing, but the parent's may be low";
  int r = in_child(256, 256, [] {
    int bad = 0;
    int before = next_number();
    UniqueFd fd(eventfd(0, EFD_CLOEXEC));
    bad += !fds::keep(fd);
    bad += fd.get() < 256 - 16 || fd.get() >= 256;  // the zone: [240, 256)
    bad += next_number() != before;
    // The program grows to the zone's edge: no more room for ours.
    std::vector<UniqueFd> mine;
    while (next_number() < 256 - 2 * 16) mine.emplace_back(eventfd(0, EFD_CLOEXEC));
    UniqueFd more(eventfd(0, EFD_CLOEXEC));
    bad += fds::keep(more);
    bad += more.get() != -1;  // closed
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(FdBudget, PromisesCountAgainstTheRoom) {
  // A limit of 16 has no zone below it: only the 8 numbers above count.
  int r = in_child(16, 24, [] {
    int bad = 0;
    fds::Promise p(6);  // 6 of the 8 promised
    UniqueFd a(eventfd(0, EFD_CLOEXEC)), b(eventfd(0, EFD_CLOEXEC));
    bad += !fds::keep(a);
    bad += fds::keep(b, 1);  // 17, room for 1 more and the 6 promised: past 23
    p.reset();
    UniqueFd c(eventfd(0, EFD_CLOEXEC));
    bad += !fds::keep(c, 1);
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(FdBudget, GapsSkipOurs) {
  int r = in_child(64, 256, [] {
    int bad = 0;
    UniqueFd a(eventfd(0, EFD_CLOEXEC)), b(eventfd(0, EFD_CLOEXEC));
    bad += !fds::keep(a) || !fds::keep(b);
    std::vector<std::pair<unsigned, unsigned>> gaps;
    fds::for_each_gap(3, ~0U, [](unsigned x, unsigned y, void* c) {
      static_cast<std::vector<std::pair<unsigned, unsigned>>*>(c)->emplace_back(x, y);
      return 0;
    }, &gaps);
    unsigned fa = static_cast<unsigned>(a.get()), fb = static_cast<unsigned>(b.get());
    bad += gaps.size() != 2 || gaps[0] != std::make_pair(3u, fa - 1) || fb != fa + 1 ||
           gaps[1] != std::make_pair(fb + 1, ~0U);
    return bad;
  });
  EXPECT_EQ(r, 0);
}

// keep() raises the soft limit for a moment: another thread's keep() must
// neither read the raised limit as the program's (and put that back, or aim
// into a zone above the real limit) nor fail for it. Four threads keep and
// close descriptors as fast as they can.
TEST(FdBudget, ConcurrentKeepsAllLandAboveAndPutTheLimitBack) {
#if defined(__SANITIZE_THREAD__)
  // Excluded under ThreadSanitizer: its descriptor bookkeeping reports the
  // numbers our moves free and the threads' eventfd() take again as a race
  // on its own shadow state (the limit this test is about is kernel state it
  // cannot see). The plain and ASan+UBSan builds run it.
  GTEST_SKIP() << "ThreadSanitizer models descriptors moved by F_DUPFD and closed by us as racing";
#endif
  int r = in_child(64, 4096, [] {
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&bad] {
        for (int i = 0; i < 2000; ++i) {
          UniqueFd fd(eventfd(0, EFD_CLOEXEC));
          if (!fds::keep(fd, 4) || fd.get() < 64) bad.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    int limit_changed = lim.rlim_cur != 64 || lim.rlim_max != 4096;
    return std::min(bad.load(), 100) + limit_changed;
  });
  EXPECT_EQ(r, 0);
}

}  // namespace
}  // namespace rdmashim
