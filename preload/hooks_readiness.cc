// Hooks for waiting: poll, ppoll, select, pselect and the epoll family.
//
// A socket whose data moved to a ring is quiet on its TCP side, so the
// kernel cannot tell when it is readable or writable. For such "virtual"
// descriptors rdmashim computes readiness from the ring (Connection::
// poll_events) and, to sleep, adds the connection's doorbell eventfd to the
// kernel wait, after asking the peer to ring it (arm). Descriptors that are
// not on a ring keep the kernel's answer, so mixed sets work in one call.
//
// epoll: an upgradable socket added to an epoll set is registered in the
// kernel under a tag that is the address of our per-set record (EpollSet),
// with EPOLLET so a quiet FIN cannot keep waking the set; the application's
// own events and data live in the record. epoll_wait merges the kernel's
// events for plain descriptors with the ring readiness of the tagged ones,
// honouring level and edge triggering, EPOLLONESHOT and the caller's data.
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include <sched.h>

#include "preload.h"
#include "util/config.h"
#include "util/misc.h"
#include "util/spin.h"

namespace rdmashim::preload {

// What we keep about one upgradable socket in one epoll set.
struct EpollReg {
  int fd;
  Ref entry;              // keeps the Connection alive while registered
  uint32_t events;        // the application's mask, flags included
  epoll_data_t data;      // returned untouched
  bool disabled = false;  // EPOLLONESHOT fired; MOD re-arms
  bool doorbell_added = false;
  // Edge-trigger state: what we saw at the last check.
  uint32_t last_ready = 0;
  uint64_t last_rx = 0, last_tx = 0;
  uint32_t last_full = 0;  // Connection::tx_full_count() at the last look
};

struct EpollSet {
  std::mutex mu;
  std::vector<std::unique_ptr<EpollReg>> regs;
  int rotate = 0;  // fairness when more are ready than fit
  uint64_t tag() const { return reinterpret_cast<uintptr_t>(this); }
  EpollReg* find(int fd) {
    for (auto& r : regs)
      if (r->fd == fd) return r.get();
    return nullptr;
  }
};

}  // namespace rdmashim::preload

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

constexpr int64_t kForever = -1;

int64_t deadline_from_ms(int ms) { return ms < 0 ? kForever : static_cast<int64_t>(now_ns()) + ms * 1'000'000LL; }
int64_t deadline_from_ts(const timespec* ts) {
  return ts ? static_cast<int64_t>(now_ns()) + ts->tv_sec * 1'000'000'000LL + ts->tv_nsec : kForever;
}
// The kernel refuses these (EINVAL) before looking at any descriptor.
bool bad_timespec(const timespec* ts) {
  return ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1'000'000'000);
}
bool expired(int64_t dl) { return dl != kForever && static_cast<int64_t>(now_ns()) >= dl; }
int ms_left(int64_t dl) {
  if (dl == kForever) return -1;
  int64_t left = dl - static_cast<int64_t>(now_ns());
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>((left + 999'999) / 1'000'000, INT32_MAX));
}
timespec ts_left(int64_t dl) {
  int64_t left = std::max<int64_t>(0, dl - static_cast<int64_t>(now_ns()));
  return timespec{static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
}

// The stream behind fd if its readiness is ours to compute: on a ring, or
// still in the handshake (whose bytes the application must not be woken for).
Ref managed_stream(int fd) {
  if (fd < 0) return Ref();
  return active_stream(fd);
}

// Spins up to RDMASHIM_SPIN_US (never past the deadline) until ready()
// says so; kernel() is asked only every few hundred turns since it costs a
// system call. Peers on a ring answer in about a microsecond: catching that
// here saves the doorbell and two context switches.
template <typename Ready, typename Kernel>
bool spin_for(int64_t dl, Ready ready, Kernel kernel) {
  uint32_t budget = spin_budget_us();
  if (budget == 0) return ready();
  uint64_t end = now_ns() + uint64_t{budget} * 1000;
  if (dl != kForever && static_cast<uint64_t>(dl) < end) end = static_cast<uint64_t>(dl);
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    if ((i & 255) == 0) {
      if (kernel()) return true;
      if (now_ns() >= end) return false;
      if ((i & 4095) == 0) sched_yield();  // leave the core to a runnable peer
    }
    cpu_relax();
  }
}

// poll/ppoll/select/pselect all come here when a virtual descriptor is among
// theirs. Returns what poll() would, with errno set on -1.
int poll_mixed(pollfd* fds, nfds_t nfds, int64_t dl, const sigset_t* mask, bool use_ppoll) {
  std::vector<Ref> virt(nfds);
  std::vector<nfds_t> vidx;
  for (nfds_t i = 0; i < nfds; ++i) {
    if ((virt[i] = managed_stream(fds[i].fd))) vidx.push_back(i);
  }
  std::vector<pollfd> k(nfds + vidx.size());
  const auto& sys = real();
  for (;;) {
    // A handshake may have moved a direction to the ring since the last turn.
    for (nfds_t i = 0; i < nfds; ++i) {
      k[i] = {fds[i].fd, virt[i] ? virt[i]->conn->kernel_interest(fds[i].events) : fds[i].events, 0};
    }
    if (sys.poll(k.data(), nfds, 0) < 0) return -1;
    int count = 0;
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = virt[i] ? virt[i]->conn->poll_events(fds[i].events, k[i].revents) : k[i].revents;
      count += fds[i].revents != 0;
    }
    if (count > 0 || expired(dl)) return count;
    bool all_virtual = vidx.size() == nfds;
    for (nfds_t v : vidx) all_virtual = all_virtual && virt[v]->conn->on_ring();
    auto ring_ready = [&] {
      for (nfds_t v : vidx)
        if (virt[v]->conn->poll_events(fds[v].events, 0)) return true;
      return false;
    };
    auto kernel_ready = [&] { return !all_virtual && sys.poll(k.data(), nfds, 0) > 0; };
    if (spin_for(dl, ring_ready, kernel_ready)) continue;

    // Sleep: ask every virtual peer to ring, re-check, then wait on the
    // kernel descriptors and the doorbells together.
    // Those still in the handshake wake the kernel wait by their TCP bytes.
    std::vector<Connection*> armed;
    for (nfds_t v : vidx) {
      Connection* c = virt[v]->conn.get();
      if (!c->on_ring()) continue;
      c->arm();
      armed.push_back(c);
    }
    bool ready = false;
    for (nfds_t v : vidx) ready = ready || virt[v]->conn->poll_events(fds[v].events, 0) != 0;
    int r = 0, err = 0;
    if (!ready) {
      for (size_t j = 0; j < vidx.size(); ++j) {
        Connection* c = virt[vidx[j]]->conn.get();
        bool was_armed = std::find(armed.begin(), armed.end(), c) != armed.end();
        k[nfds + j] = {was_armed ? c->doorbell() : -1, POLLIN, 0};
      }
      if (use_ppoll) {
        timespec t = ts_left(dl);
        r = sys.ppoll(k.data(), k.size(), dl == kForever ? nullptr : &t, mask);
      } else {
        r = sys.poll(k.data(), k.size(), ms_left(dl));
      }
      err = errno;
    }
    for (Connection* c : armed) c->disarm();
    if (r < 0) {
      errno = err;
      return -1;  // EINTR included: poll is never restarted
    }
  }
}

bool any_managed_stream(const pollfd* fds, nfds_t nfds) {
  for (nfds_t i = 0; i < nfds; ++i)
    if (managed_stream(fds[i].fd)) return true;
  return false;
}

// select and pselect: through poll_mixed when a virtual descriptor is set.
int select_mixed(int nfds, fd_set* r, fd_set* w, fd_set* e, int64_t dl, const sigset_t* mask, bool use_ppoll) {
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (r && FD_ISSET(fd, r)) ev |= POLLIN;
    if (w && FD_ISSET(fd, w)) ev |= POLLOUT;
    if (e && FD_ISSET(fd, e)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  int n = poll_mixed(p.data(), p.size(), dl, mask, use_ppoll);
  if (n < 0) return -1;
  for (auto& q : p) {
    if (q.revents & POLLNVAL) {
      errno = EBADF;
      return -1;
    }
  }
  int count = 0;
  if (r) FD_ZERO(r);
  if (w) FD_ZERO(w);
  if (e) FD_ZERO(e);
  for (auto& q : p) {
    // The kernel's select maps: readable = IN|HUP|ERR, writable = OUT|ERR, except = PRI.
    if (r && (q.events & POLLIN) && (q.revents & (POLLIN | POLLHUP | POLLERR))) FD_SET(q.fd, r), ++count;
    if (w && (q.events & POLLOUT) && (q.revents & (POLLOUT | POLLERR))) FD_SET(q.fd, w), ++count;
    if (e && (q.events & POLLPRI) && (q.revents & POLLPRI)) FD_SET(q.fd, e), ++count;
  }
  return count;
}

bool select_has_managed_stream(int nfds, const fd_set* r, const fd_set* w, const fd_set* e) {
  if (nfds < 0 || nfds > FD_SETSIZE) return false;
  for (int fd = 0; fd < nfds; ++fd) {
    if ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))) {
      if (managed_stream(fd)) return true;
    }
  }
  return false;
}

// ---- epoll ----

std::shared_ptr<EpollSet> epoll_set(int epfd) {
  Ref e = table().get(epfd);
  if (e && e->kind.load() == Entry::Kind::kEpoll) return e->epoll;
  return nullptr;
}

void track_epoll(int epfd) {
  if (epfd < 0) return;
  auto* e = new (std::nothrow) Entry(Entry::Kind::kEpoll);
  if (!e) return;
  e->epoll = std::shared_ptr<EpollSet>(new (std::nothrow) EpollSet());
  if (!e->epoll) {
    delete e;
    return;
  }
  e->aliases[e->alias_count++] = epfd;
  if (!table().set(epfd, e)) delete e;
}

constexpr uint32_t kKernelEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;

int epoll_ctl_virtual(EpollSet& set, int epfd, int op, int fd, epoll_event* ev, Ref stream) {
  std::lock_guard<std::mutex> lock(set.mu);
  EpollReg* reg = set.find(fd);
  epoll_event k{};
  k.events = kKernelEvents;
  k.data.u64 = set.tag();
  // The kernel copies the event in before it looks at anything else.
  if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && !ev) return errno = EFAULT, -1;
  // EPOLLEXCLUSIVE: only with these bits, only at ADD, and never modified.
  constexpr uint32_t kExclusiveOk = EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP | EPOLLWAKEUP | EPOLLET | EPOLLEXCLUSIVE;
  if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && (ev->events & EPOLLEXCLUSIVE) &&
      (op == EPOLL_CTL_MOD || (ev->events & ~kExclusiveOk))) {
    return errno = EINVAL, -1;
  }
  switch (op) {
    case EPOLL_CTL_ADD: {
      if (reg) return errno = EEXIST, -1;
      if (real().epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &k) != 0) return -1;  // EBADF, EINVAL, EPERM, ELOOP...
      auto r = std::make_unique<EpollReg>();
      r->fd = fd;
      r->entry = std::move(stream);
      r->events = ev->events;
      r->data = ev->data;
      set.regs.push_back(std::move(r));
      return 0;
    }
    case EPOLL_CTL_MOD:
      if (!reg) return errno = ENOENT, -1;
      if (reg->events & EPOLLEXCLUSIVE) return errno = EINVAL, -1;
      reg->events = ev->events;
      reg->data = ev->data;
      reg->disabled = false;
      reg->last_ready = 0;  // a MOD re-reports what is ready now, as the kernel does
      return 0;
    case EPOLL_CTL_DEL: {
      if (!reg) return errno = ENOENT, -1;
      real().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      Connection* c = reg->entry->conn.get();
      bool shared = false;
      for (auto& r : set.regs)
        if (r.get() != reg && r->entry->conn.get() == c) shared = true;
      if (reg->doorbell_added && !shared) real().epoll_ctl(epfd, EPOLL_CTL_DEL, c->doorbell(), nullptr);
      set.regs.erase(std::find_if(set.regs.begin(), set.regs.end(), [&](auto& r) { return r.get() == reg; }));
      return 0;
    }
  }
  return errno = EINVAL, -1;
}

// Ready events of one registration, honouring edge triggering and ONESHOT.
uint32_t reg_events(EpollReg& r, short kernel) {
  if (r.disabled) return 0;
  Connection& c = *r.entry->conn;
  short want = static_cast<short>(r.events & (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLRDNORM | EPOLLWRNORM));
  uint32_t ready = static_cast<uint16_t>(c.poll_events(want, kernel));
  uint32_t report = ready;
  if (r.events & EPOLLET) {
    uint64_t rx = c.rx_progress(), tx = c.tx_progress();
    uint32_t full = c.tx_full_count();
    report = 0;
    // An edge: the condition became true, or more arrived since we looked.
    if ((ready & EPOLLIN) && (!(r.last_ready & EPOLLIN) || rx != r.last_rx)) report |= ready & (EPOLLIN | EPOLLRDNORM);
    // Room is news only to a writer that ran out of it since we looked.
    if ((ready & EPOLLOUT) && (!(r.last_ready & EPOLLOUT) || (tx != r.last_tx && full != r.last_full))) {
      report |= ready & (EPOLLOUT | EPOLLWRNORM);
    }
    report |= ready & ~r.last_ready & (EPOLLRDHUP | EPOLLERR | EPOLLHUP | EPOLLPRI);
    if (report) report |= ready & (EPOLLERR | EPOLLHUP);
    r.last_ready = ready;
    r.last_rx = rx;
    r.last_tx = tx;
    r.last_full = full;
  }
  if (report && (r.events & EPOLLONESHOT)) r.disabled = true;
  return report;
}

// Drops the tagged events out of what the kernel returned; returns how many
// of the application's own remain at the front.
int keep_user_events(const EpollSet& set, epoll_event* ev, int n) {
  int out = 0;
  for (int i = 0; i < n; ++i)
    if (ev[i].data.u64 != set.tag()) ev[out++] = ev[i];
  return out;
}

// Appends ready registrations after `have` events; returns the new count.
int scan_virtual(EpollSet& set, int epfd, epoll_event* ev, int have, int max) {
  std::lock_guard<std::mutex> lock(set.mu);
  std::erase_if(set.regs, [&](auto& r) {
    {
      // Registrations whose descriptors were all closed are gone for the kernel too.
      std::lock_guard<std::mutex> l(r->entry->mu);
      if (r->entry->alias_count == 0) return true;
    }
    // A connection that settled on plain TCP goes back to the kernel with the
    // application's own mask and data: nothing of ours left in its path.
    if (r->entry->conn->passthrough() && !r->disabled) {
      epoll_event k{r->events, r->data};
      return real().epoll_ctl(epfd, EPOLL_CTL_MOD, r->fd, &k) == 0;
    }
    return false;
  });
  size_t n = set.regs.size();
  if (n == 0 || have >= max) return have;
  std::vector<pollfd> k(n);
  for (size_t i = 0; i < n; ++i) {
    Connection& c = *set.regs[i]->entry->conn;
    k[i] = {set.regs[i]->fd, c.kernel_interest(static_cast<short>(set.regs[i]->events & 0xffff)), 0};
  }
  real().poll(k.data(), n, 0);
  size_t start = static_cast<size_t>(set.rotate++) % n;
  for (size_t j = 0; j < n && have < max; ++j) {
    size_t i = (start + j) % n;
    uint32_t e = reg_events(*set.regs[i], k[i].revents);
    if (e) ev[have++] = epoll_event{e, set.regs[i]->data};
  }
  return have;
}

// Arms every upgraded registration (adding its doorbell to the kernel set
// once); returns true if one turned ready meanwhile.
bool arm_all(EpollSet& set, int epfd, std::vector<Ref>& armed) {
  std::lock_guard<std::mutex> lock(set.mu);
  bool ready = false;
  for (auto& r : set.regs) {
    Connection& c = *r->entry->conn;
    if (r->disabled || !c.on_ring()) continue;
    if (!r->doorbell_added) {
      epoll_event k{};
      k.events = EPOLLIN | EPOLLET;
      k.data.u64 = set.tag();
      int rc = real().epoll_ctl(epfd, EPOLL_CTL_ADD, c.doorbell(), &k);
      r->doorbell_added = rc == 0 || errno == EEXIST;
    }
    c.arm();
    armed.push_back(share(r->entry.get()));
    short want = static_cast<short>(r->events & (EPOLLIN | EPOLLOUT | EPOLLRDHUP));
    if (!(r->events & EPOLLET) && c.poll_events(want, 0)) ready = true;
    if ((r->events & EPOLLET) && c.rx_progress() != r->last_rx) ready = true;
  }
  return ready;
}

int epoll_wait_mixed(EpollSet& set, int epfd, epoll_event* ev, int max, int64_t dl, const sigset_t* mask,
                     bool with_mask) {
  for (;;) {
    int n = real().epoll_pwait(epfd, ev, max, 0, nullptr);
    if (n < 0) return -1;
    int have = scan_virtual(set, epfd, ev, keep_user_events(set, ev, n), max);
    if (have > 0 || expired(dl)) return have;

    // Spin on the rings (and now and then on the kernel's list) first.
    std::vector<std::pair<Ref, short>> watch;
    {
      std::lock_guard<std::mutex> lock(set.mu);
      for (auto& r : set.regs) {
        if (r->disabled || !r->entry->conn->on_ring()) continue;
        watch.emplace_back(share(r->entry.get()), static_cast<short>(r->events & (EPOLLIN | EPOLLOUT)));
      }
    }
    bool kernel_has_more = false;
    auto ring_ready = [&] {
      for (auto& [e, want] : watch)
        if (e->conn->poll_events(want, 0)) return true;
      return false;
    };
    auto kernel_ready = [&] {
      pollfd p{epfd, POLLIN, 0};
      return kernel_has_more = real().poll(&p, 1, 0) > 0;
    };
    if (!watch.empty() && spin_for(dl, ring_ready, kernel_ready)) continue;

    std::vector<Ref> armed;
    bool ready = arm_all(set, epfd, armed);
    int err = 0;
    if (!ready) {
      timespec t = ts_left(dl);
      n = real().epoll_pwait2(epfd, ev, max, dl == kForever ? nullptr : &t, with_mask ? mask : nullptr);
      err = errno;
    } else {
      n = 0;
    }
    for (auto& r : armed) r->conn->disarm();
    if (n < 0) {
      errno = err;
      return -1;  // EINTR: epoll_wait is never restarted
    }
    have = scan_virtual(set, epfd, ev, keep_user_events(set, ev, n), max);
    if (have > 0) return have;
  }
}

}  // namespace

extern "C" {

int poll(pollfd* fds, nfds_t nfds, int timeout) {
  if (nfds == 0 || !any_managed_stream(fds, nfds)) return real().poll(fds, nfds, timeout);
  return poll_mixed(fds, nfds, deadline_from_ms(timeout), nullptr, false);
}

int __poll_chk(pollfd* fds, nfds_t nfds, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < nfds) abort();  // glibc's __chk_fail, minus the message
  return poll(fds, nfds, timeout);
}

int ppoll(pollfd* fds, nfds_t nfds, const timespec* ts, const sigset_t* mask) {
  if (nfds == 0 || !any_managed_stream(fds, nfds)) return real().ppoll(fds, nfds, ts, mask);
  if (bad_timespec(ts)) return syscall_result(-EINVAL);
  return poll_mixed(fds, nfds, deadline_from_ts(ts), mask, true);
}

int __ppoll_chk(pollfd* fds, nfds_t nfds, const timespec* ts, const sigset_t* mask, size_t fdslen) {
  if (fdslen / sizeof(*fds) < nfds) abort();
  return ppoll(fds, nfds, ts, mask);
}

int select(int nfds, fd_set* r, fd_set* w, fd_set* e, timeval* tv) {
  if (!select_has_managed_stream(nfds, r, w, e)) return real().select(nfds, r, w, e, tv);
  int64_t dl = tv ? static_cast<int64_t>(now_ns()) + tv->tv_sec * 1'000'000'000LL + tv->tv_usec * 1000LL : kForever;
  int n = select_mixed(nfds, r, w, e, dl, nullptr, false);
  if (tv) {  // Linux reports the time left
    int64_t left = std::max<int64_t>(0, dl - static_cast<int64_t>(now_ns()));
    tv->tv_sec = left / 1'000'000'000;
    tv->tv_usec = (left % 1'000'000'000) / 1000;
  }
  return n;
}

int pselect(int nfds, fd_set* r, fd_set* w, fd_set* e, const timespec* ts, const sigset_t* mask) {
  if (!select_has_managed_stream(nfds, r, w, e)) return real().pselect(nfds, r, w, e, ts, mask);
  if (bad_timespec(ts)) return syscall_result(-EINVAL);
  return select_mixed(nfds, r, w, e, deadline_from_ts(ts), mask, true);
}

int epoll_create(int size) {
  int fd = real().epoll_create(size);
  if (fd >= 0) track_epoll(fd);
  return fd;
}

int epoll_create1(int flags) {
  int fd = real().epoll_create1(flags);
  if (fd >= 0) track_epoll(fd);
  return fd;
}

int epoll_ctl(int epfd, int op, int fd, epoll_event* ev) {
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  if (set) {
    // Upgradable streams (not yet decided, or on a ring) are ours; so is a
    // descriptor we registered earlier, until it is deleted.
    Ref s = active_stream(fd);
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(set->mu);
      known = set->find(fd) != nullptr;
    }
    if (s || known) {
      int saved = errno;
      int r = epoll_ctl_virtual(*set, epfd, op, fd, ev, std::move(s));
      if (r == 0) errno = saved;
      return r;
    }
  }
  return real().epoll_ctl(epfd, op, fd, ev);
}

int epoll_wait(int epfd, epoll_event* ev, int max, int timeout) {
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  if (!set || max <= 0 || !ev) return real().epoll_pwait(epfd, ev, max, timeout, nullptr);
  return epoll_wait_mixed(*set, epfd, ev, max, deadline_from_ms(timeout), nullptr, false);
}

int epoll_pwait(int epfd, epoll_event* ev, int max, int timeout, const sigset_t* mask) {
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  if (!set || max <= 0 || !ev) return real().epoll_pwait(epfd, ev, max, timeout, mask);
  return epoll_wait_mixed(*set, epfd, ev, max, deadline_from_ms(timeout), mask, true);
}

int epoll_pwait2(int epfd, epoll_event* ev, int max, const timespec* ts, const sigset_t* mask) {
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  if (!set || max <= 0 || !ev) return real().epoll_pwait2(epfd, ev, max, ts, mask);
  if (bad_timespec(ts)) return syscall_result(-EINVAL);
  return epoll_wait_mixed(*set, epfd, ev, max, deadline_from_ts(ts), mask, true);
}

}  // extern "C"
