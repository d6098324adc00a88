// Hooks for waiting, the epoll family: epoll_create, epoll_create1,
// epoll_ctl, epoll_wait, epoll_pwait and epoll_pwait2 (the poll family is in
// hooks_poll.cc; the set's data structures in epoll_set.h).
//
// A socket whose data moved to a ring is quiet on its TCP side, so the
// kernel cannot tell when it is readable or writable; rdmashim computes its
// readiness from the ring (Connection::poll_events).
//
// epoll: an upgradable socket added to an epoll set is registered in the
// kernel under a tag of ours (EpollSet::tag_of), with EPOLLET so a quiet FIN
// cannot keep waking the set; the application's own events and data live in
// our record (EpollReg), which a DEL leaves lingering for the next ADD. epoll_wait merges the kernel's
// events for plain descriptors with the ring readiness of the tagged ones,
// honouring level and edge triggering, EPOLLONESHOT and the caller's data.
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "epoll_set.h"
#include "preload.h"
#include "wait_common.h"

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

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

// The readiness bits an epoll mask may ask for, and what EPOLLEXCLUSIVE allows.
constexpr uint32_t kPollBits = EPOLLIN | EPOLLPRI | EPOLLOUT | EPOLLRDNORM | EPOLLRDBAND | EPOLLWRNORM |
                               EPOLLWRBAND | EPOLLMSG | EPOLLRDHUP;
constexpr uint32_t kExclusiveOk = EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP | EPOLLWAKEUP | EPOLLET | EPOLLEXCLUSIVE;

// The kernel registration under our tag: only the directions the
// application asked for, edge-triggered, so an idle socket (or a writable
// TCP side under a ring) never makes the set itself look readable.
epoll_event kernel_reg(uint64_t tag, uint32_t app, bool is_set) {
  epoll_event k{};
  k.events = EPOLLET;
  if (is_set) {
    k.events |= EPOLLIN;
  } else {
    if (app & (EPOLLIN | EPOLLRDNORM | EPOLLRDHUP)) k.events |= EPOLLIN | EPOLLRDHUP;
    if (app & (EPOLLOUT | EPOLLWRNORM)) k.events |= EPOLLOUT;
    if (app & EPOLLPRI) k.events |= EPOLLPRI;
  }
  k.data.u64 = tag;
  return k;
}

uint32_t reg_ready(EpollReg& r, short kernel, int depth) {
  short want = static_cast<short>(r.events & kPollBits);
  if (EpollSet* in = r.inner()) {
    return depth > kMaxEpollDepth ? 0 : static_cast<uint16_t>(set_events(*in, want, kernel, depth + 1));
  }
  return static_cast<uint16_t>(r.entry->conn->poll_events(want, kernel));
}

// What an edge-triggered registration reports of `ready`: a condition that
// became true, more bytes since the last look (or a read that found EAGAIN
// on TCP), or for OUT a write that found the ring (or TCP) full since: TCP's
// edge needs SOCK_NOSPACE. Moving onto the ring is no edge, but a write that
// filled the ring since is (its count starts at 0 there), else a writer that
// met EAGAIN right after the switch would never hear of credit.
uint32_t edges(const EpollReg& r, uint32_t ready, uint64_t rx, uint64_t tx) {
  constexpr uint32_t in = EPOLLIN | EPOLLRDNORM, out = EPOLLOUT | EPOLLWRNORM;
  constexpr uint64_t on_ring = uint64_t{1} << 63;
  uint32_t report = ready & ~r.last_ready & (EPOLLRDHUP | EPOLLERR | EPOLLHUP | EPOLLPRI);
  if ((ready & in) && (!(r.last_ready & in) || rx != r.last_rx)) report |= ready & in;
  bool filled = ((tx ^ r.last_tx) & on_ring) ? (tx & ~on_ring) != 0 : tx != r.last_tx;
  if ((ready & out) && (!(r.last_ready & out) || filled)) report |= ready & out;
  if (report) report |= ready & (EPOLLERR | EPOLLHUP);
  return report;
}

uint64_t rx_of(const EpollReg& r) { return r.inner() ? 0 : r.entry->conn->rx_progress(); }
uint64_t tx_of(const EpollReg& r) { return r.inner() ? 0 : r.entry->conn->tx_progress(); }

// Whether r would report now, without changing its state.
bool reg_peek(EpollReg& r, int depth) {
  if (r.disabled || r.lingering) return false;
  uint32_t ready = reg_ready(r, 0, depth);
  return (r.events & EPOLLET) ? edges(r, ready, rx_of(r), tx_of(r)) != 0 : ready != 0;
}

// Asked of the kernel for input only: a look that finds nothing stays true
// until an edge under the record's tag (EpollReg::kernel_hot).
bool input_only(short asked) { return (asked & ~(POLLIN | POLLRDHUP)) == 0; }
// ... and all of it watched by r's edge-triggered registration.
bool edges_tell_all(const EpollReg& r, short asked) {
  return asked != 0 && input_only(asked) && (static_cast<uint32_t>(asked) & ~r.kernel_events) == 0;
}

// After the kernel's ADD of r: an edge-triggered registration queues an
// event at once for what is there already, so a socket not on a ring yet
// whose edges tell all (tcp_side_quiet) needs no look of ours until one
// comes: a fresh connection is not asked about at every wait until its
// client's first bytes come.
bool born_quiet(const EpollReg& r) {
  if (r.inner() || r.entry->conn->on_ring()) return false;
  return edges_tell_all(r, r.entry->conn->kernel_interest(static_cast<short>(r.events & kPollBits)));
}

// Deferred ADDs (EpollReg::deferred). An event loop adds each accepted
// socket and waits; the kernel's registration then costs a call, and the
// look for a Hello that readiness needs before the ring costs another (a
// peek: a Hello must never read as the program's bytes, nor wake it for
// nothing). The look alone says whether such a socket is readable, so the
// ADD waits for the next wait's look: a short connection is read, answered
// and closed before the kernel ever needs it (nginx without keep-alive:
// TCP's count of calls). Only for what a look can answer: a server socket
// untouched since accept, asking only for input, in a set nobody sleeps on;
// and while such looks mostly find bytes (EpollSet::defer_wanted).
bool may_defer(const EpollReg& r) {
  constexpr uint32_t kLookable = EPOLLIN | EPOLLRDNORM | EPOLLRDHUP;
  return !r.inner() && r.slot != 0 && !SleepingOnSets::anyone() && (r.events & (EPOLLIN | EPOLLRDNORM)) &&
         (r.events & kPollBits & ~kLookable) == 0 && !(r.events & EPOLLEXCLUSIVE) &&
         r.entry->conn->untouched_server() && !r.entry->conn->on_ring();
}

// Makes a deferred ADD in the kernel: under our tag, or for a socket that
// settled on plain TCP as the program's own registration. `quiet`: a look
// just found nothing, which the kernel would only repeat. 1: made as the
// program's (the record goes); 0: made; -1: refused (the record stays
// deferred and is looked at every wait).
int commit_deferred(EpollSet& set, int epfd, EpollReg& r, bool quiet) {
  auto add = [&](epoll_event k) {
    // A forked sibling sharing the set may have made it already.
    return real().epoll_ctl(epfd, EPOLL_CTL_ADD, r.fd, &k) == 0 ||
           (errno == EEXIST && real().epoll_ctl(epfd, EPOLL_CTL_MOD, r.fd, &k) == 0);
  };
  r.deferred = false;
  if (r.entry->conn->passthrough() && !r.disabled) {
    if (add(epoll_event{r.events, r.data})) return 1;
  } else {
    epoll_event k = kernel_reg(set.tag_of(r), r.events, false);
    if (add(k)) {
      r.kernel_events = k.events;
      r.kernel_hot = !quiet && !born_quiet(r);  // after a look that found nothing, what comes is an edge
      return 0;
    }
  }
  r.deferred = true;
  r.deferred_look = 0;
  set.deferred_unlooked = true;
  return -1;
}

// Registers the doorbell of r's connection (on its rings) in the kernel's
// set, once. set.mu held.
void add_doorbell(EpollSet& set, int epfd, EpollReg& r) {
  if (r.doorbell_added) return;
  epoll_event k{};
  k.events = EPOLLIN | EPOLLET;
  k.data.u64 = set.tag();
  int rc = real().epoll_ctl(epfd, EPOLL_CTL_ADD, r.entry->conn->doorbell(), &k);
  r.doorbell_added = rc == 0 || errno == EEXIST;
}

// A sleeper on the set, about to sleep, leaves the set's kick with c (not
// on its rings yet): made and put in the kernel's set once. set.mu held.
void watch_switch(EpollSet& set, int epfd, Connection& c) {
  if (!set.kick && !set.kick_refused) {
    std::shared_ptr<Kick> kick = Kick::make(Kick::Owner::kEpollSet);
    epoll_event k{};
    k.events = EPOLLIN | EPOLLET;
    k.data.u64 = set.tag();
    if (kick && real().epoll_ctl(epfd, EPOLL_CTL_ADD, kick->fd(), &k) == 0) {
      kick->asleep(set.sleepers);
      set.kick = std::move(kick);
    }
    set.kick_refused = !set.kick;
  }
  if (set.kick) c.watch_switch(set.kick);
}

// The sleepers on the set armed the records they found before they slept;
// r, added or changed since, is armed here for them (EpollSet::sleepers).
// A socket not on its rings needs nothing: what moves it there (a Hello, a
// Switch) is an edge on its TCP side. set.mu held.
void arm_for_sleepers(EpollSet& set, int epfd, EpollReg& r) {
  if (set.sleepers == 0 || r.inner() || r.disabled || r.lingering || !r.entry->conn->on_ring()) return;
  auto events = static_cast<short>(r.events & (EPOLLIN | EPOLLRDNORM | EPOLLOUT | EPOLLWRNORM));
  unsigned want = Connection::arms_for(events);
  // Once per connection and direction, however many MODs a long sleep sees.
  for (const Armed& a : set.armed_for_sleepers)
    if (a.ref.get() == r.entry.get()) want &= ~a.what;
  if (want == 0) return;
  add_doorbell(set, epfd, r);
  short ask = static_cast<short>(((want & Link::kWaitData) ? POLLIN : 0) | ((want & Link::kWaitSpace) ? POLLOUT : 0));
  set.armed_for_sleepers.push_back({share(r.entry.get()), r.entry->conn->arm(ask), kInWaitedSet});
}

// Brings the kernel's registration under r's tag up to date after the
// program's ADD or MOD changed r (r.events and the rest are already new),
// or after a native registration became r. `fresh`: the kernel has none
// (ADD); one not yet under our tag has kernel_events 0, so it always gets
// its MOD.
// With no thread asleep on a set of ours the kernel is asked only when a
// direction is missing, and then for all asked so far, so a loop that
// toggles its interest per request makes no call. With one asleep the call
// is made, as the program's would be: it wakes the sleeper if the socket is
// ready, and if r is ready on its ring (armed for the sleepers first, so
// what comes after the look rings), EPOLLOUT on the quiet (writable) TCP
// side makes the edge that wakes it.
int update_kernel_reg(EpollSet& set, int epfd, EpollReg& r, epoll_event k, bool fresh) {
  if (r.deferred) {  // the kernel has none yet: a MOD of the program's
    if (may_defer(r)) return 0;
    fresh = true;
  }
  if (!SleepingOnSets::anyone()) {
    if (!fresh && (k.events & ~r.kernel_events) == 0) return 0;
    if (!fresh) k.events |= r.kernel_events;
  } else if (!r.inner() && r.entry->conn->on_ring()) {
    arm_for_sleepers(set, epfd, r);
    if (reg_peek(r, 1)) k.events |= EPOLLOUT;
  }
  if (real().epoll_ctl(epfd, fresh ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, r.fd, &k) != 0) return -1;
  r.deferred = false;
  r.kernel_events = k.events;
  r.kernel_hot = !(fresh && born_quiet(r));
  return 0;
}

// Registrations the kernel holds natively for sockets that have since become
// upgradable streams move under our tag, with the application's mask and data.
void adopt_natives(EpollSet& set, int epfd) {
  for (size_t i = 0; i < set.natives.size();) {
    NativeReg n = set.natives[i];
    Ref e = table().get(n.fd);
    if (!e) {  // not connected yet (or closed: the kernel dropped it too)
      ++i;
      continue;
    }
    bool pending = e->kind.load() == Entry::Kind::kPending;
    e = Ref();
    Ref s = active_stream(n.fd);
    if (!s) {
      if (pending) {
        Ref again = table().get(n.fd);
        if (again && again->kind.load() == Entry::Kind::kPending) {
          ++i;  // still connecting
          continue;
        }
      }
      set.natives.erase(set.natives.begin() + static_cast<long>(i));  // plain for good
      continue;
    }
    set.natives.erase(set.natives.begin() + static_cast<long>(i));
    if (set.find(n.fd)) continue;
    auto r = std::make_unique<EpollReg>();
    r->fd = n.fd;
    r->entry = std::move(s);
    r->events = n.ev.events;
    r->data = n.ev.data;
    EpollReg* reg = set.add(std::move(r));
    if (update_kernel_reg(set, epfd, *reg, kernel_reg(set.tag_of(*reg), n.ev.events, false), false) != 0) set.remove(reg);
  }
}

void drop_native(EpollSet& set, int fd) {
  std::erase_if(set.natives, [&](const NativeReg& n) { return n.fd == fd; });
}

// epoll_ctl for a descriptor the kernel alone handles; remembers sockets
// that may become streams while registered. set.mu held.
int epoll_ctl_native(EpollSet& set, int epfd, int op, int fd, epoll_event* ev) {
  int r = real().epoll_ctl(epfd, op, fd, ev);
  if (r != 0) return r;
  int saved = errno;
  if (op == EPOLL_CTL_DEL) {
    drop_native(set, fd);
  } else if (op == EPOLL_CTL_MOD) {
    for (auto& n : set.natives)
      if (n.fd == fd) n.ev = *ev;
  } else if (op == EPOLL_CTL_ADD) {
    drop_native(set, fd);  // a number reused after close
    if (!(ev->events & EPOLLEXCLUSIVE) && may_become_stream(fd)) set.natives.push_back({fd, *ev});
  }
  errno = saved;
  return 0;
}

// Forgets our registration of fd if that descriptor was closed since (the
// kernel forgot it then), whatever the number names now. set.mu held.
void drop_stale(EpollSet& set, int fd, const Ref& target) {
  EpollReg* reg = set.find(fd);
  if (!reg) return;
  bool closed = reg->entry->alias_count.load(std::memory_order_acquire) == 0;
  if (closed || (target && reg->entry.get() != target.get())) set.remove(reg);
}

// What the program's ADD or MOD replaces in a record: put back as it was
// if the kernel refuses the request.
struct Request {
  uint32_t events;
  epoll_data_t data;
  bool disabled, lingering;
  uint32_t last_ready;
};

// The program's ADD or MOD of r: its mask and data, re-armed (ONESHOT) and
// reporting what is ready now, as the kernel does. Returns what it replaced.
Request take_request(EpollSet& set, EpollReg& r, const epoll_event& ev) {
  Request old{r.events, r.data, r.disabled, r.lingering, r.last_ready};
  set.unlinger(r);
  r.events = ev.events;
  r.data = ev.data;
  r.disabled = false;
  r.last_ready = 0;
  return old;
}

void restore_request(EpollSet& set, EpollReg& r, const Request& old) {
  r.events = old.events;
  r.data = old.data;
  r.disabled = old.disabled;
  r.last_ready = old.last_ready;
  if (old.lingering) set.linger(r);
}

// set.mu held. `target` is the stream, or the inner epoll set's entry.
int epoll_ctl_virtual(EpollSet& set, int epfd, int op, int fd, epoll_event* ev, Ref target) {
  // The kernel's order: the event is copied first, then EPOLLEXCLUSIVE's rules.
  if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && !ev) return errno = EFAULT, -1;
  EpollReg* reg = set.find(fd);
  bool is_set = reg ? reg->inner() != nullptr : (target && target->epoll != nullptr);
  if (ev && (op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && (ev->events & EPOLLEXCLUSIVE)) {
    if (op == EPOLL_CTL_MOD || is_set || (ev->events & ~kExclusiveOk)) return errno = EINVAL, -1;
  }
  // A lingering record is deleted as far as the program can tell.
  bool lingering = reg && reg->lingering;
  switch (op) {
    case EPOLL_CTL_ADD:
    case EPOLL_CTL_MOD: {
      if (op == EPOLL_CTL_ADD && reg && !lingering) return errno = EEXIST, -1;
      if (op == EPOLL_CTL_MOD && lingering) return errno = ENOENT, -1;
      if (reg && (reg->events & EPOLLEXCLUSIVE) && op == EPOLL_CTL_MOD) return errno = EINVAL, -1;
      // A new record: an ADD, or a MOD that converts a native registration
      // (made before the socket became a stream); ENOENT if there is none.
      bool fresh = !reg;
      if (fresh) {
        if (op == EPOLL_CTL_MOD && !target) return errno = ENOENT, -1;
        auto r = std::make_unique<EpollReg>();
        r->fd = fd;
        r->entry = std::move(target);
        reg = set.add(std::move(r));  // first, for its tag
      }
      Request replaced = take_request(set, *reg, *ev);
      if (fresh && op == EPOLL_CTL_ADD && may_defer(*reg) && set.defer_wanted()) {
        reg->deferred = true;
        reg->deferred_look = 0;
        set.deferred_unlooked = true;
        drop_native(set, fd);
        return 0;
      }
      // A native registration is converted by MOD, like a record of ours.
      if (update_kernel_reg(set, epfd, *reg, kernel_reg(set.tag_of(*reg), ev->events, is_set),
                            fresh && op == EPOLL_CTL_ADD) != 0) {
        int err = errno;
        // ENOENT: the descriptor was closed meanwhile.
        if (fresh || err == ENOENT) set.remove(reg);
        else restore_request(set, *reg, replaced);
        return errno = err, -1;
      }
      drop_native(set, fd);
      return 0;
    }
    case EPOLL_CTL_DEL: {
      if (!reg) {
        drop_native(set, fd);
        return real().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      }
      if (lingering) return errno = ENOENT, -1;
      // A stream's record lingers, with its kernel registration and
      // doorbell, for the add that event loops make next; the set's next
      // wait (tidy) deletes what was not added back.
      if (!reg->inner()) {
        set.linger(*reg);
        return 0;
      }
      real().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      set.remove(reg);
      return 0;
    }
  }
  return errno = EINVAL, -1;
}

// What a registration reports of `ready`, honouring edge triggering and ONESHOT.
uint32_t report_of(EpollReg& r, uint32_t ready) {
  uint32_t report = ready;
  if (r.events & EPOLLET) {
    uint64_t rx = rx_of(r), tx = tx_of(r);
    report = edges(r, ready, rx, tx);
    r.last_ready = ready;
    r.last_rx = rx;
    r.last_tx = tx;
  }
  if (report && (r.events & EPOLLONESHOT)) r.disabled = true;
  return report;
}

// Ready events of one registration, honouring edge triggering and ONESHOT.
uint32_t reg_events(EpollReg& r, short kernel) {
  if (r.disabled || r.lingering) return 0;
  return report_of(r, reg_ready(r, kernel, 1));
}

// What a deferred ADD's record is ready for: the look for a Hello, or the
// kernel where the look cannot say (Connection::first_look).
uint32_t deferred_ready(EpollReg& r) {
  Connection& c = *r.entry->conn;
  short want = static_cast<short>(r.events & kPollBits);
  short got = c.first_look(want);
  if (got >= 0) return static_cast<uint16_t>(got);
  pollfd p{r.fd, c.kernel_interest(want), 0};
  real().poll(&p, 1, 0);
  return reg_ready(r, p.revents, 1);
}

// The looks of deferred ADDs not looked at yet (EpollReg::deferred); the
// kernel is asked only where the look cannot answer (Connection::first_look).
// Returns how many reported. When none did, they go into the kernel now,
// before the caller may sleep; else at the next wait (tidy), if still there.
int look_deferred(EpollSet& set, int epfd, epoll_event* ev, int max) {
  if (!set.deferred_unlooked) return 0;  // no walk of a set of 500 at every wait
  int have = 0;
  bool any = false, left = false;
  for (auto& rp : set.regs) {
    EpollReg& r = *rp;
    if (!r.deferred || r.deferred_look != 0) continue;
    if (r.lingering || have >= max) {
      left = true;  // still to look at, once added again or when there is room
      continue;
    }
    any = true;
    r.deferred_look = set.waits;
    if (r.disabled) continue;
    uint32_t ready = deferred_ready(r);
    set.deferred_looked((ready & (EPOLLIN | EPOLLRDNORM | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
    if (uint32_t e = report_of(r, ready)) ev[have++] = epoll_event{e, r.data};
  }
  set.deferred_unlooked = left;
  if (any && have == 0) {
    set.remove_if([&](EpollReg& r) {
      return r.deferred && r.deferred_look == set.waits && commit_deferred(set, epfd, r, true) == 1;
    });
  }
  return have;
}

// Drops the tagged events out of what the kernel returned, noting whose
// TCP side spoke; returns how many of the application's own remain at the
// front. set.mu held.
int keep_user_events(EpollSet& set, epoll_event* ev, int n) {
  int out = 0;
  for (int i = 0; i < n; ++i) {
    if (!set.ours(ev[i].data.u64)) {
      ev[out++] = ev[i];
    } else if (EpollReg* r = set.by_tag(ev[i].data.u64)) {
      r->kernel_hot = r->unseen_edge = true;
      r->harvested = ev[i].events;
      r->harvest_look = set.look;
    }
  }
  return out;
}

// Forgets registrations whose descriptors are gone, and hands connections
// that settled on plain TCP back to the kernel. set.mu held.
void tidy(EpollSet& set, int epfd) {
  adopt_natives(set, epfd);
  set.remove_if([&](EpollReg& r) {
    // Registrations whose descriptors were all closed are gone for the kernel too.
    if (r.entry->alias_count.load(std::memory_order_acquire) == 0) return true;
    // Deleted by the program and not added back before this wait: now the
    // kernel forgets it too, and its doorbell unless a duplicate is registered.
    if (r.lingering) {
      if (!r.deferred) real().epoll_ctl(epfd, EPOLL_CTL_DEL, r.fd, nullptr);
      if (r.doorbell_added && set.registrations_of(r.entry.get()) == 1) {
        real().epoll_ctl(epfd, EPOLL_CTL_DEL, r.entry->conn->doorbell(), nullptr);
      }
      return true;
    }
    // A deferred ADD looked at in an earlier wait goes in now (still open,
    // still registered: a connection that lives on).
    if (r.deferred) {
      if (r.deferred_look == 0 || r.deferred_look == set.waits) return false;  // its look is this wait's
      return commit_deferred(set, epfd, r, false) == 1;
    }
    // A connection that settled on plain TCP goes back to the kernel with the
    // application's own mask and data: nothing of ours left in its path.
    // Level-triggered, not in the wait that first finds it so: a short
    // connection is closed by the next one (or deleted first, as libevent,
    // libuv and Python do), and the kernel then forgets it without a call; a
    // long one pays the same one call, a wait later. (Edge-triggered, at
    // once: its edges count bytes read through us, and a plain stream's
    // bytes are read past us.)
    if (!r.inner() && r.entry->conn->passthrough() && !r.disabled) {
      if (r.plain_since == 0) r.plain_since = set.waits;
      if (r.plain_since == set.waits && !(r.events & EPOLLET)) return false;
      epoll_event k{r.events, r.data};
      return real().epoll_ctl(epfd, EPOLL_CTL_MOD, r.fd, &k) == 0;
    }
    return false;
  });
}

// With no edge under r's own tag since a look found its TCP side quiet,
// asking the kernel about it would tell nothing: on both rings, before the
// end (the kernel would report only POLLIN, and `asked` is just that), or
// asked for input only, all of which its edge-triggered registration
// watches (a socket still looking for a Hello: a fresh connection waiting
// for its client's first bytes).
bool tcp_side_quiet(EpollReg& r, short asked) {
  if (r.slot == 0 || r.kernel_hot || r.inner() || r.entry->conn->control_unsettled()) return false;
  if (asked == POLLIN && r.entry->conn->kernel_interest(POLLIN | POLLOUT) == POLLIN) return true;
  return edges_tell_all(r, asked);
}

// Appends ready registrations after `have` events; returns the new count.
// set.mu held.
int scan_virtual(EpollSet& set, epoll_event* ev, int have, int max) {
  size_t n = set.regs.size();
  if (n == 0) return have;
  if (have >= max) {
    // No room: if ours are ready they go first next time (the kernel's list
    // rotates level-triggered events the same way).
    for (auto& r : set.regs)
      if (reg_peek(*r, 1)) set.virt_owed = true;
    return have;
  }
  // The kernel is asked only about sockets it may have news of: not on
  // their rings yet, or whose TCP side had an edge since a look found it
  // quiet (or whose bytes there wait for a lock: settle_control).
  std::vector<pollfd>& k = set.scan_all;
  std::vector<pollfd>& asked = set.scan_asked;
  std::vector<size_t>& of = set.scan_of;
  k.resize(n);
  asked.clear();
  of.clear();
  for (size_t i = 0; i < n; ++i) {
    EpollReg& r = *set.regs[i];
    short want = static_cast<short>(r.events & kPollBits);
    k[i] = {r.fd, r.inner() ? want : r.entry->conn->kernel_interest(want), 0};
    if (r.lingering || tcp_side_quiet(r, k[i].events)) continue;
    // The kernel's epoll_wait of this look named it: its answer is what a
    // poll would say now (epoll reports the readiness it finds at the time),
    // if our registration asks for all the poll would.
    auto asks = static_cast<uint16_t>(k[i].events) & ~static_cast<uint32_t>(POLLERR | POLLHUP);
    if (r.slot != 0 && r.harvest_look == set.look && !r.inner() && (asks & ~r.kernel_events) == 0) {
      k[i].revents = static_cast<short>(r.harvested & (asks | POLLERR | POLLHUP));
      r.unseen_edge = false;
      if (input_only(k[i].events) && k[i].revents == 0) r.kernel_hot = false;
      continue;
    }
    asked.push_back(k[i]);
    of.push_back(i);
  }
  ++set.look;  // the harvests were this look's
  if (!asked.empty()) real().poll(asked.data(), asked.size(), 0);
  for (size_t j = 0; j < asked.size(); ++j) {
    EpollReg& r = *set.regs[of[j]];
    r.unseen_edge = false;
    k[of[j]].revents = asked[j].revents;
    // Quiet on its ring: only a new edge under its tag makes it worth asking.
    if (input_only(k[of[j]].events) && asked[j].revents == 0) r.kernel_hot = false;
  }
  size_t start = static_cast<size_t>(set.rotate++) % n;
  for (size_t j = 0; j < n; ++j) {
    size_t i = (start + j) % n;
    if (have >= max) {
      if (reg_peek(*set.regs[i], 1)) set.virt_owed = true;
      continue;
    }
    EpollReg& r = *set.regs[i];
    if (r.lingering) continue;
    uint32_t e = reg_events(r, k[i].revents);
    // A direction that left its ring just now (a Downgrade read above) is
    // the kernel's again: ask the kernel for it before saying nothing.
    if (!r.inner() && !r.disabled) {
      short now = r.entry->conn->kernel_interest(static_cast<short>(r.events & kPollBits));
      if (now != k[i].events) {
        pollfd p{r.fd, now, 0};
        real().poll(&p, 1, 0);
        e |= reg_events(r, p.revents);
      }
    }
    if (e) ev[have++] = epoll_event{e, r.data};
  }
  return have;
}

// Whether none of the set's records can report without the kernel's help:
// none ready on its ring, none owed, and every TCP side quiet (no edge
// under its tag since a look found it so). Looks only. set.mu held.
bool nothing_ready_on_rings(EpollSet& set) {
  if (set.virt_owed) return false;
  for (auto& r : set.regs) {
    if (r->lingering) continue;
    if (r->inner() || r->deferred) return false;  // nested sets, a refused ADD: the usual look
    short want = static_cast<short>(r->events & kPollBits);
    if (!tcp_side_quiet(*r, r->entry->conn->kernel_interest(want)) || reg_peek(*r, 1)) return false;
  }
  return true;
}

// Whether any registration (inner sets' included) is on a ring, so spinning
// on the rings can pay off. set.mu held; inner sets are locked in turn.
bool regs_on_ring(EpollSet& set, int depth) {
  for (auto& r : set.regs) {
    if (r->disabled || r->lingering) continue;
    if (EpollSet* in = r->inner()) {
      if (depth >= kMaxEpollDepth) continue;
      std::lock_guard<std::mutex> lock(in->mu);
      if (regs_on_ring(*in, depth + 1)) return true;
    } else if (r->entry->conn->on_ring()) {
      return true;
    }
  }
  return false;
}

// One look without sleeping: the kernel's events for plain descriptors and
// ours, fairly when they do not all fit. `first`: the first look of the
// program's wait (counted in EpollSet::waits). Says in *on_ring whether a
// registration is on a ring (the caller spins then). When this first look
// finds nothing the caller sleeps in the kernel's epoll_wait (unless it
// spins), which returns at once with whatever the kernel has: so when
// nothing of ours is ready the kernel need not be asked first, one system
// call less per wakeup of an event loop.
int collect(EpollSet& set, int epfd, epoll_event* ev, int max, bool first, int64_t dl, bool* on_ring) {
  std::lock_guard<std::mutex> lock(set.mu);
  if (first) ++set.waits;
  *on_ring = regs_on_ring(set, 1);
  const bool will_sleep = first && !expired(dl) && !(*on_ring && Spinner::would_spin());
  ++set.look;  // what an earlier look harvested and never scanned is old news
  tidy(set, epfd);
  if (int have = look_deferred(set, epfd, ev, max)) return have;  // the kernel's list next time
  if (will_sleep && nothing_ready_on_rings(set)) return 0;
  int have = 0;
  bool ours_first = set.virt_owed;
  set.virt_owed = false;
  if (ours_first) have = scan_virtual(set, ev, 0, max);
  // Our tagged events take slots in the kernel's answer: ask again while
  // only those filled it (not after one of the application's came back: a
  // level-triggered one would come again, and the kernel never repeats one).
  for (int turn = 0; turn < 4 && have < max; ++turn) {
    int room = max - have;
    int n = real().epoll_pwait(epfd, ev + have, room, 0, nullptr);
    if (n < 0) {
      if (have > 0) break;
      return -1;
    }
    int kept = keep_user_events(set, ev + have, n);
    have += kept;
    if (kept > 0 || n < room) break;
  }
  if (!ours_first) have = scan_virtual(set, ev, have, max);
  return have;
}

bool any_peek(EpollSet& set) {
  std::lock_guard<std::mutex> lock(set.mu);
  for (auto& r : set.regs)
    if (reg_peek(*r, 1)) return true;
  return false;
}

int epoll_wait_mixed(EpollSet& set, int epfd, epoll_event* ev, int max, int64_t dl, const sigset_t* mask) {
  std::vector<pollfd> watch;
  std::vector<int> quiet;
  // The first look of a wait that goes to sleep at once (no spin) leaves the
  // kernel's list to the sleep. Later turns look at it: a sleep that also
  // watched connecting clients (a poll) reported the set only as readable.
  bool first = true;
  for (;;) {
    bool on_ring = false;
    int have = collect(set, epfd, ev, max, first, dl, &on_ring);
    first = false;
    if (have != 0 || expired(dl)) return have;

    // Spin on the rings (and now and then on the kernel's list) first.
    std::optional<Spinner> spin;
    if (on_ring) {
      spin.emplace(spin_deadline(dl));
      auto ring_ready = [&] { return any_peek(set); };
      auto kernel_ready = [&] {
        pollfd p{epfd, POLLIN, 0};
        return real().poll(&p, 1, 0) > 0;
      };
      if (spin_for(*spin, ring_ready, kernel_ready)) continue;
    }

    // Sleep on the kernel's list (plain descriptors, our tagged sockets'
    // TCP sides, the doorbells), then merge as above.
    // A handshake prefix's deadline ends the sleep early (its bytes turn
    // readable), as does a held first write's (Connection::wake_deadline).
    std::vector<Armed> armed;
    int64_t wake = dl;
    SleepingOnSets sleeping;
    bool ready = arm_all(set, epfd, armed, 1, wake, sleeping);
    // Clients in the set still connecting: their connect wakes us too (the
    // Hello goes out); the set's events are collected at the next turn.
    watch.clear();
    connecting_natives(set, watch, quiet);
    int n = 0, err = 0;
    if (!ready) {
      int64_t sleep_dl = release_before_sleep(wake);
      timespec t = ts_left(sleep_dl);
      if (!watch.empty()) n = sleep_with_connects(epfd, watch, sleep_dl, mask, quiet);
      // Refused (beyond RLIMIT_NOFILE, a sandbox): the set alone, as before.
      if (watch.empty() || (n < 0 && errno != EINTR)) {
        n = sys::epoll_wait_ts(epfd, ev, max, sleep_dl == kForever ? nullptr : &t, mask);
      }
      err = errno;
    }
    // The doorbells sit in the set edge-triggered: every ring is a new edge,
    // so what epoll_wait took leaves nothing to drain now, and the rings left
    // queued go in batches (ShmLink::finish_edge_sleep). A set nested in it,
    // or a sleep in ppoll (clients connecting), leaves their edges on a
    // ready list that a queued ring would keep readable: those drain.
    for (auto& a : armed) {
      if (a.slot == kInWaitedSet && watch.empty()) {
        a.ref->conn->disarm_edge(a.what);
      } else {
        a.ref->conn->disarm(a.what, false);
      }
    }
    sleeping.end();
    if (n < 0) {
      errno = err;
      return -1;  // EINTR: epoll_wait is never restarted
    }
    std::lock_guard<std::mutex> lock(set.mu);
    ++set.look;
    tidy(set, epfd);
    have = scan_virtual(set, ev, keep_user_events(set, ev, n), max);
    if (have > 0 && spin) spin->found();
    if (have > 0) return have;
  }
}

}  // namespace

// The set as one descriptor for the poll family (declared in epoll_set.h).
namespace rdmashim::preload {

bool has_regs(EpollSet& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  return !s.regs.empty();
}

// An epoll set of ours as a descriptor to wait on: readable when the kernel
// says so (its plain descriptors) or when one of its registrations would
// report an event now. Looks only: no edge or ONESHOT state changes.
short set_events(EpollSet& s, short want, short kernel, int depth) {
  short ev = static_cast<short>(kernel & (POLLIN | POLLRDNORM | POLLERR | POLLHUP | POLLNVAL));
  if (!(ev & POLLIN)) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& r : s.regs) {
      // A deferred ADD is not in the kernel's set yet: its look says (a
      // program that only polls the set without sleeping, or an outer set).
      bool deferred = r->deferred && !r->lingering && !r->disabled;
      uint32_t ready = deferred ? deferred_ready(*r) : 0;
      if (deferred ? ((r->events & EPOLLET) ? edges(*r, ready, rx_of(*r), tx_of(*r)) != 0 : ready != 0)
                   : reg_peek(*r, depth)) {
        ev |= POLLIN | POLLRDNORM;
        break;
      }
    }
  }
  return static_cast<short>(ev & (want | POLLERR | POLLHUP | POLLNVAL));
}

// Arms every upgraded registration (adding its doorbell to the kernel set
// once), inner sets' included; returns true if one turned ready meanwhile.
bool arm_all(EpollSet& set, int epfd, std::vector<Armed>& armed, int depth, int64_t& wake, SleepingOnSets& sleep) {
  std::lock_guard<std::mutex> lock(set.mu);
  sleep.enter(set);
  bool ready = false;
  // Nothing deferred sleeps outside the kernel's set (a refused ADD: a look
  // every millisecond).
  set.remove_if([&](EpollReg& r) {
    if (!r.deferred || r.lingering) return false;
    int made = commit_deferred(set, epfd, r, false);
    if (made < 0) wake = look_again_soon(wake);
    return made == 1;
  });
  for (auto& r : set.regs) {
    if (r->disabled || r->lingering) continue;
    if (EpollSet* in = r->inner()) {
      if (depth < kMaxEpollDepth && arm_all(*in, r->fd, armed, depth + 1, wake, sleep)) ready = true;
      continue;
    }
    Connection& c = *r->entry->conn;
    wake = earliest(wake, c.wake_deadline());
    // A held first write ends with the Hello: the kernel must tell us of
    // its bytes even where the program asked for EPOLLOUT only.
    if (!(r->kernel_events & EPOLLIN) && c.holding(now_ns())) {
      epoll_event k{};
      k.events = r->kernel_events | EPOLLIN | EPOLLRDHUP;
      k.data.u64 = set.tag_of(*r);
      if (real().epoll_ctl(epfd, EPOLL_CTL_MOD, r->fd, &k) == 0) r->kernel_events = k.events;
    }
    if (!c.on_ring() && !c.passthrough()) watch_switch(set, epfd, c);
    if (c.on_ring()) {
      add_doorbell(set, epfd, *r);
      unsigned what = c.arm(static_cast<short>(r->events & (EPOLLIN | EPOLLRDNORM | EPOLLOUT | EPOLLWRNORM)));
      armed.push_back({share(r->entry.get()), what, depth == 1 ? kInWaitedSet : kInNestedSet});
    }
    // What another thread holds or left unread has spent its kernel edge: a
    // FIN or frame a look could not read (read it now), or a read taking a
    // Switch in. Look again in a millisecond rather than sleep past it.
    if (!c.settle_control() || c.setup_read_elsewhere()) wake = look_again_soon(wake);
  }
  // Checked after arming: a change from now on rings a doorbell. An edge
  // taken from the kernel after the last look (collect() looks at ours
  // first when they are owed) is gone from its list: look before sleeping.
  for (auto& r : set.regs)
    if ((r->unseen_edge && !r->lingering) || reg_peek(*r, depth)) ready = true;
  return ready;
}

namespace {
std::atomic<int> sleeping_on_sets{0};
}
SleepingOnSets::SleepingOnSets() { sleeping_on_sets.fetch_add(1, std::memory_order_seq_cst); }
SleepingOnSets::~SleepingOnSets() {
  end();
  sleeping_on_sets.fetch_sub(1, std::memory_order_seq_cst);
}
bool SleepingOnSets::anyone() { return sleeping_on_sets.load(std::memory_order_seq_cst) != 0; }
void SleepingOnSets::enter(EpollSet& s) {
  ++s.sleepers;
  if (s.kick) s.kick->asleep(1);
  if (!first_) {
    first_ = s.shared_from_this();
  } else {
    more_.push_back(s.shared_from_this());
  }
}
void SleepingOnSets::end() {
  auto leave = [](EpollSet& s) {
    std::vector<Armed> armed;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.kick) s.kick->asleep(-1);
      if (--s.sleepers == 0) armed.swap(s.armed_for_sleepers);
    }
    for (auto& a : armed) a.ref->conn->disarm(a.what, false);
  };
  if (first_) leave(*first_);
  for (auto& s : more_) leave(*s);
  first_.reset();
  more_.clear();
}

void forget_in_epoll_sets(int fd, bool lingering_only) {
  std::vector<std::pair<int, std::shared_ptr<EpollSet>>> sets;
  table().for_each_fd([&](int epfd) {
    Ref e = table().get(epfd);
    if (e && e->kind.load() == Entry::Kind::kEpoll && e->epoll) sets.emplace_back(epfd, e->epoll);
  });
  for (auto& [epfd, set] : sets) {
    std::lock_guard<std::mutex> lock(set->mu);
    size_t before = set->natives.size();
    bool in_kernel = false;  // a deferred ADD never was
    set->remove_if([&](const EpollReg& r) {
      bool drop = r.fd == fd && !r.inner() && (r.lingering || !lingering_only);
      if (drop && !r.deferred) in_kernel = true;
      return drop;
    });
    if (!lingering_only) drop_native(*set, fd);
    if (in_kernel || set->natives.size() != before) real().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
  }
}

}  // namespace rdmashim::preload

extern "C" {

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
  // Upgradable streams (not yet decided, or on a ring) and our own epoll
  // sets are ours; so is a descriptor we registered earlier, until deleted.
  // One look at the table for the target (event loops make this call per
  // request), and none at all for a stream that settled plain.
  Ref target = table().get_unless_plain(fd);
  // An event loop's daemon registers its listener once, long before its
  // first accept: take over its advertisement there.
  if (target && target->kind.load() == Entry::Kind::kListener) {
    if (op == EPOLL_CTL_ADD) take_over_listener(*target.get());
    target = Ref();
  }
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  if (!set) return real().epoll_ctl(epfd, op, fd, ev);
  if (target && (target->kind.load() != Entry::Kind::kEpoll || !target->epoll)) {
    target = Ref();
    target = active_stream(fd);
  }
  std::lock_guard<std::mutex> lock(set->mu);
  drop_stale(*set, fd, target);
  int saved = errno;
  int r = target || set->find(fd) ? epoll_ctl_virtual(*set, epfd, op, fd, ev, std::move(target))
                                  : epoll_ctl_native(*set, epfd, op, fd, ev);
  if (r == 0) errno = saved;
  return r;
}

int epoll_wait(int epfd, epoll_event* ev, int max, int timeout) {
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  if (!set || max <= 0 || !ev) {
    release_before_plain_sleep(timeout != 0);
    return real().epoll_pwait(epfd, ev, max, timeout, nullptr);
  }
  return epoll_wait_mixed(*set, epfd, ev, max, deadline_from_ms(timeout), nullptr);
}

int epoll_pwait(int epfd, epoll_event* ev, int max, int timeout, const sigset_t* mask) {
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  if (!set || max <= 0 || !ev) {
    release_before_plain_sleep(timeout != 0);
    return real().epoll_pwait(epfd, ev, max, timeout, mask);
  }
  return epoll_wait_mixed(*set, epfd, ev, max, deadline_from_ms(timeout), mask);
}

int epoll_pwait2(int epfd, epoll_event* ev, int max, const timespec* ts, const sigset_t* mask) {
  std::shared_ptr<EpollSet> set = epoll_set(epfd);
  // A kernel (or libc) without the call says ENOSYS to the application as
  // it would without us; our own waits fall back to epoll_pwait.
  if (sys::epoll_pwait2_missing()) return errno = ENOSYS, -1;
  if (!set || max <= 0 || !ev || bad_timespec(ts)) return real().epoll_pwait2(epfd, ev, max, ts, mask);
  return epoll_wait_mixed(*set, epfd, ev, max, deadline_from_ts(ts), mask);
}

}  // extern "C"
