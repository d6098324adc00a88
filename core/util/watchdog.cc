#include "util/watchdog.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "util/thread.h"

namespace rdmashim {
namespace {

struct Job {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;
  std::function<void()> work, if_abandoned;
};

void* run_job(void* arg) {
  auto* owner = static_cast<std::shared_ptr<Job>*>(arg);
  std::shared_ptr<Job> j = std::move(*owner);
  delete owner;
  j->work();
  bool abandoned;
  {
    std::lock_guard<std::mutex> l(j->mu);
    j->done = true;
    abandoned = j->abandoned;
    j->cv.notify_all();
  }
  if (abandoned && j->if_abandoned) j->if_abandoned();
  return nullptr;
}

}  // namespace

bool run_bounded(uint32_t ms, std::function<void()> work, std::function<void()> if_abandoned) {
  auto job = std::make_shared<Job>();
  job->work = std::move(work);
  job->if_abandoned = std::move(if_abandoned);
  auto* arg = new (std::nothrow) std::shared_ptr<Job>(job);
  if (!arg || !start_background_thread(run_job, arg)) {
    delete arg;
    job->work();  // no thread to spare: here, unbounded
    return true;
  }
  std::unique_lock<std::mutex> l(job->mu);
  if (job->cv.wait_for(l, std::chrono::milliseconds(ms), [&] { return job->done; })) return true;
  job->abandoned = true;
  return false;
}

}  // namespace rdmashim
