// The watchdog that bounds provider calls (util/watchdog.h): a call that
// blocks leaves the caller after the bound, and what it made is released
// on its own thread when it returns, never by the caller.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "util/misc.h"
#include "util/watchdog.h"

namespace rdmashim {
namespace {

TEST(Watchdog, WorkInTimeRunsBeforeTheReturnAndIsNotReleased) {
  int value = 0;
  bool released = false;
  EXPECT_TRUE(run_bounded(1000, [&] { value = 42; }, [&] { released = true; }));
  EXPECT_EQ(value, 42);
  EXPECT_FALSE(released);
}

TEST(Watchdog, BlockedWorkIsLeftAfterTheBoundAndReleasedWhenItReturns) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  auto gate = std::make_shared<Gate>();
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  uint64_t t0 = now_ns();
  bool in_time = run_bounded(
      100,
      [gate, finished] {
        std::unique_lock<std::mutex> l(gate->mu);
        gate->cv.wait(l, [&] { return gate->open; });  // a provider call that does not return
        finished->store(true);
      },
      [released, finished] { released->store(finished->load()); });
  uint64_t waited_ms = (now_ns() - t0) / 1'000'000;
  EXPECT_FALSE(in_time);
  EXPECT_GE(waited_ms, 100u);
  EXPECT_LT(waited_ms, 2000u);  // the caller was not held by the blocked call
  EXPECT_FALSE(released->load());
  {
    std::lock_guard<std::mutex> l(gate->mu);
    gate->open = true;
  }
  gate->cv.notify_all();
  for (int i = 0; i < 500 && !released->load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(released->load()) << "the late work's leftovers were not released after it returned";
}

}  // namespace
}  // namespace rdmashim
