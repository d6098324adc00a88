#include "util/schedule.h"

#include <sched.h>
#include <time.h>

#include <cerrno>

#include "util/config.h"

namespace rdmashim::sched {
namespace {

std::atomic<uint64_t> g_threads{0};
thread_local uint64_t t_rng = 0;  // 0: not seeded yet

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

const char* point_name(Point p) {
  static const char* const kNames[kPointCount] = {
      "handshake-send-hello", "handshake-detect-hello", "handshake-send-ack", "handshake-ack-sent",
      "handshake-await-ack",  "handshake-attach",       "switch-send",        "switch-sent",
      "switch-received",      "plain-received",         "ring-wrap-write",    "ring-wrap-read",
      "ring-publish-tail",    "ring-publish-head",      "ring-grow",          "ring-shrink",
      "readiness-consume",    "wait-armed",             "shutdown-fin",
      "close-drain",          "close-real",             "downgrade-send",     "downgrade-received", "read-empty"};
  return p < kPointCount ? kNames[p] : "?";
}

namespace {
void seed_thread() {
  if (t_rng == 0) {
    uint64_t ordinal = g_threads.fetch_add(1, std::memory_order_relaxed);
    t_rng = splitmix(config().test_schedule ^ splitmix(ordinal)) | 1;
  }
}
}  // namespace

bool downgrade_now() {
  if (g_state.load(std::memory_order_relaxed) == kUnknown) (void)config();
  uint32_t n = config().test_downgrade;
  if (g_state.load(std::memory_order_relaxed) != kOn || n == 0) return false;
  seed_thread();
  t_rng = splitmix(t_rng ^ 0xd0);
  return (t_rng >> 16) % n == 0;
}

void perturb(Point p) {
  if (g_state.load(std::memory_order_relaxed) == kUnknown) (void)config();
  if (g_state.load(std::memory_order_relaxed) != kOn) return;
  seed_thread();
  t_rng = splitmix(t_rng ^ p);
  uint64_t r = t_rng;
  // The ring and wait points run once per call: perturbed one time in
  // eight, or a long stream of small writes would take seconds.
  bool per_call = (p >= kRingWrapWrite && p <= kWaitArmed) || p == kReadEmpty;
  if (per_call && ((r >> 40) & 7) != 0) return;
  switch (r & 3) {
    case 0:
      return;
    case 1: {
      int saved = errno;
      sched_yield();
      errno = saved;
      return;
    }
    default: {
      int saved = errno;
      timespec ts{0, static_cast<long>((r >> 8) % 201) * 1000};
      nanosleep(&ts, nullptr);
      errno = saved;
      return;
    }
  }
}

}  // namespace rdmashim::sched
