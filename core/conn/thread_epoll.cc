#include "conn/thread_epoll.h"

#include <sys/epoll.h>

#include <atomic>
#include <cerrno>

#include "sys/calls.h"
#include "sys/sys.h"
#include "util/fd_budget.h"
#include "util/misc.h"
#include "util/process.h"

namespace rdmashim::thread_epoll {
namespace {

// Registrations carry key << 1 | which, so an edge from one left behind
// (a descriptor closed, or its number reused, before we could delete it)
// is told apart and slept through.
constexpr uint64_t kDoorbell = 0, kTcp = 1;

// Threads' instances in the program's range (fds::keep_for_thread).
fds::ThreadRange g_in_range;

struct State {
  int ep = -1;           // ours (fd_budget.h) while is_ours(ep)
  bool in_range = false;  // counted in g_in_range
  bool refused = false;  // no room for it, or no registration: this thread polls for good
  bool busy = false;     // a Sleep is live: a signal handler's own sleep polls
  uint64_t last_key = 0;  // the connection of the last sleep, registered or not
  uint64_t key = 0;       // what is registered: key's doorbell and tcp
  int doorbell = -1, tcp = -1;
  uint32_t tcp_events = 0;

  ~State() { drop(); }
  // Our number is no longer ours if the program dup2()ed onto it: then it
  // is the program's descriptor, never closed here.
  bool valid() const { return ep >= 0 && fds::is_ours(ep); }
  void drop() {
    if (valid()) fds::close(ep);
    if (in_range) g_in_range.used.fetch_sub(1, std::memory_order_relaxed);
    in_range = false;
    ep = -1;
    key = 0;
  }
  void forget() {  // after fork: the instance is the parent's too
    drop();
    last_key = 0;
    g_in_range.used.store(0, std::memory_order_relaxed);  // the parent's other threads are not here
  }
};
thread_local State t;

bool add(int ep, int fd, uint32_t events, uint64_t data) {
  epoll_event ev{};
  ev.events = events | EPOLLET;
  ev.data.u64 = data;
  return sys::real().epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0;
}

// A new epoll instance, one of ours (fds::keep_for_thread).
UniqueFd open_instance(bool* in_range) {
  UniqueFd fd;
  fds::keep_for_thread(fd, [] { return UniqueFd(sys::real().epoll_create1(EPOLL_CLOEXEC)); }, g_in_range, in_range);
  return fd;
}

// Registers key's doorbell and TCP side in place of what was there.
bool register_pair(uint64_t key, int doorbell, int tcp, uint32_t tcp_events) {
  if (!t.valid()) {
    t.drop();  // a number the program took over: forgotten, and its slot in range freed
    bool in_range = false;
    UniqueFd fd = open_instance(&in_range);
    if (!fd) {
      t.refused = true;
      return false;
    }
    t.ep = fd.release();
    t.in_range = in_range;
  } else if (t.key != 0) {
    // Fails harmlessly where a number was closed or reused: its edges then
    // carry the old key and are slept through.
    sys::real().epoll_ctl(t.ep, EPOLL_CTL_DEL, t.doorbell, nullptr);
    sys::real().epoll_ctl(t.ep, EPOLL_CTL_DEL, t.tcp, nullptr);
    t.key = 0;
  }
  if (!add(t.ep, doorbell, EPOLLIN, key << 1 | kDoorbell) || !add(t.ep, tcp, tcp_events, key << 1 | kTcp)) {
    // Out of epoll watches (fs.epoll.max_user_watches), or a descriptor the
    // kernel would not take: this thread polls, as without it.
    t.drop();
    t.refused = true;
    return false;
  }
  t.key = key;
  t.doorbell = doorbell;
  t.tcp = tcp;
  t.tcp_events = tcp_events;
  return true;
}

}  // namespace

Sleep::Sleep(uint64_t key, int doorbell, int tcp, short tcp_events) {
  if (key == 0 || t.busy || t.refused || sandbox() != Sandbox::kNone) return;
  const uint32_t events = static_cast<uint16_t>(tcp_events);  // poll and epoll share these bits
  if (t.key == key && t.doorbell == doorbell && t.tcp == tcp && t.valid()) {
    if (t.tcp_events != events) {
      epoll_event ev{};
      ev.events = events | EPOLLET;
      ev.data.u64 = key << 1 | kTcp;
      if (sys::real().epoll_ctl(t.ep, EPOLL_CTL_MOD, tcp, &ev) != 0) {
        t.drop();
        return;
      }
      t.tcp_events = events;
    }
  } else {
    bool again = t.last_key == key;
    t.last_key = key;
    if (!again || !register_pair(key, doorbell, tcp, events)) return;
  }
  t.busy = true;
  epfd_ = t.ep;
  key_ = key;
}

Sleep::~Sleep() {
  if (epfd_ >= 0) t.busy = false;
}

int Sleep::wait(pollfd (&p)[2], int timeout_ms) {
  const int64_t dl = timeout_ms < 0 ? -1 : static_cast<int64_t>(now_ns()) + int64_t{timeout_ms} * 1'000'000;
  p[0].revents = p[1].revents = 0;
  for (;;) {
    epoll_event ev[4];
    int n = sys::real().epoll_wait(epfd_, ev, 4, timeout_ms);
    if (n < 0 && errno != EINTR) {
      // Never expected (the instance is ours): never the program's error.
      // This thread polls from now on, this sleep too (active() turns false).
      t.drop();
      t.refused = true;
      t.busy = false;
      epfd_ = -1;
      return sys::wait(p, 2, timeout_ms);
    }
    if (n <= 0) return n;
    int count = 0;
    for (int i = 0; i < n; ++i) {
      if (ev[i].data.u64 >> 1 != key_) continue;  // a registration left behind
      short& revents = p[ev[i].data.u64 & 1].revents;
      if (revents == 0) ++count;
      revents = static_cast<short>(revents | static_cast<short>(ev[i].events & 0xffff));
    }
    if (count > 0) return count;
    if (dl >= 0) {
      int64_t left = dl - static_cast<int64_t>(now_ns());
      if (left <= 0) return 0;
      timeout_ms = static_cast<int>((left + 999'999) / 1'000'000);
    }
  }
}

void after_fork_child() { t.forget(); }

}  // namespace rdmashim::thread_epoll
