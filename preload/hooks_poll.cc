// Hooks for waiting, the poll family: poll, ppoll, select, pselect and
// their _FORTIFY_SOURCE variants (the epoll family is in hooks_epoll.cc).
//
// A socket whose data moved to a ring is quiet on its TCP side, so the
// kernel cannot tell when it is readable or writable. For such "virtual"
// descriptors rdmashim computes readiness from the ring (Connection::
// poll_events) and, to sleep, adds the connection's doorbell eventfd to the
// kernel wait, after asking the peer to ring it (arm). Descriptors that are
// not on a ring keep the kernel's answer, so mixed sets work in one call.
// An epoll set of ours among the descriptors counts as virtual when it holds
// such sockets (epoll_set.h).
#include <poll.h>
#include <signal.h>
#include <sys/select.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <vector>

#include "epoll_set.h"
#include "preload.h"
#include "sys/calls.h"
#include "util/misc.h"
#include "wait_common.h"

using namespace rdmashim;
using namespace rdmashim::preload;

namespace {

// The entry behind fd if its readiness is ours to compute: a stream on a
// ring or still in the handshake (whose bytes the application must not be
// woken for), or an epoll set of ours holding such streams.
Ref managed_stream(int fd) {
  if (fd < 0) return Ref();
  Ref e = table().get_unless_plain(fd);  // a stream settled plain: the kernel's word, for one load
  if (!e) return e;
  if (e->kind.load() == Entry::Kind::kEpoll) return e->epoll && has_regs(*e->epoll) ? std::move(e) : Ref();
  e = Ref();
  return active_stream(fd);
}

short kernel_interest(const Ref& v, short want) { return v->epoll ? want : v->conn->kernel_interest(want); }
short virtual_events(const Ref& v, short want, short kernel) {
  return v->epoll ? set_events(*v->epoll, want, kernel, 1) : v->conn->poll_events(want, kernel);
}

// The program may wait on as many descriptors as RLIMIT_NOFILE allows (the
// kernel's EINVAL beyond): OpenSSH's sandbox allows one. Then each ring's
// doorbell stands in for its socket, a slice at a time; the caller's loop
// looks at the sockets themselves (without waiting) in between. A client
// still connecting is watched in its own slot (POLLOUT added); the clients
// an epoll set holds have no slot and are settled after each slice. What
// the doorbells and connects reported goes back to their slots in k.
int sleep_within_nofile(std::vector<pollfd>& k, const std::vector<nfds_t>& vidx,
                        const std::vector<nfds_t>& connecting, nfds_t nfds, int64_t dl, const sigset_t* mask,
                        sys::WaitCall how) {
  std::vector<pollfd> one(k.begin(), k.begin() + static_cast<long>(nfds));
  for (size_t j = 0; j < vidx.size(); ++j) {
    if (k[nfds + j].fd >= 0) one[vidx[j]] = {k[nfds + j].fd, POLLIN, 0};
  }
  size_t base = nfds + vidx.size();
  for (nfds_t i : connecting) one[i].events |= POLLOUT;
  constexpr int kSliceMs = 200;
  int left = ms_left(dl);
  int slice = left < 0 || left > kSliceMs ? kSliceMs : left;
  int r = sys::wait_as(how, one.data(), one.size(), slice, mask);
  for (size_t j = 0; r > 0 && j < vidx.size(); ++j) {
    if (k[nfds + j].fd >= 0) k[nfds + j].revents = one[vidx[j]].revents;
  }
  for (size_t j = 0; r > 0 && j < connecting.size(); ++j) {
    k[base + j].revents = static_cast<short>(one[connecting[j]].revents & (POLLOUT | POLLERR | POLLHUP));
  }
  int saved = errno;
  for (size_t j = base + connecting.size(); r >= 0 && j < k.size(); ++j) (void)settle_connecting(k[j].fd);
  errno = saved;
  return r;
}

// After a sleep: the connecting clients whose connect completed (or failed)
// are settled (the Hello goes out) and leave `connecting`; those that became
// streams in the handshake are virtual from now on (an Ack must not wake the
// program). One still connecting although its slot fired is watched no more.
void settle_connects(pollfd* fds, const std::vector<pollfd>& k, nfds_t nfds, std::vector<Ref>& virt,
                     std::vector<nfds_t>& vidx, std::vector<nfds_t>& connecting, std::vector<int>& quiet) {
  size_t base = nfds + vidx.size();
  std::vector<nfds_t> still;
  for (size_t j = 0; j < connecting.size(); ++j) {
    nfds_t i = connecting[j];
    if (k[base + j].revents == 0 && connecting_client(fds[i].fd)) {
      still.push_back(i);
    } else if (settle_connecting(fds[i].fd) && (virt[i] = managed_stream(fds[i].fd))) {
      vidx.push_back(i);
    }
  }
  // The clients of epoll sets among fds: their sets take them in.
  for (size_t j = base + connecting.size(); j < k.size(); ++j) {
    if (k[j].revents && !settle_connecting(k[j].fd)) quiet.push_back(k[j].fd);
  }
  connecting.swap(still);
}

// This thread's kick (Connection::watch_switch) for one sleep: counted
// asleep from the first socket it watches until the wake-up.
class SleepKick {
 public:
  SleepKick() = default;
  SleepKick(const SleepKick&) = delete;
  SleepKick& operator=(const SleepKick&) = delete;
  ~SleepKick() { forget(); }
  void watch(Connection& c) {
    if (!kick_) {
      if (!(kick_ = thread_kick())) return;
      kick_->asleep(1);
    }
    c.watch_switch(kick_);
  }
  int fd() const { return kick_ ? kick_->fd() : -1; }
  void drain() { kick_->drain(); }
  void forget() {
    if (kick_) kick_->asleep(-1);
    kick_.reset();
  }

 private:
  std::shared_ptr<Kick> kick_;
};

// poll/ppoll/select/pselect all come here when a virtual descriptor, or a
// client still connecting, is among theirs. Returns what poll() would, with
// errno set on -1.
int poll_mixed(pollfd* fds, nfds_t nfds, int64_t dl, const sigset_t* mask, sys::WaitCall how) {
  std::vector<Ref> virt(nfds);
  std::vector<nfds_t> vidx, connecting;  // clients still connecting: watched for writability too
  std::vector<int> quiet;  // clients of epoll sets among fds still connecting after their slot fired
  for (nfds_t i = 0; i < nfds; ++i) {
    if ((virt[i] = managed_stream(fds[i].fd))) vidx.push_back(i);
    else if (connecting_client(fds[i].fd)) connecting.push_back(i);
  }
  std::vector<pollfd> k;
  const auto& sys = real();
  // The kernel's answer for fds is looked at without waiting (the program's
  // own call, as all below), except where a sleep gives it: the first turn
  // of a wait that will not spin goes to sleep unless a ring is ready (its
  // sleep returns at once if the kernel has anything), and a sleep's answer
  // serves the next turn. One or two system calls less per wakeup.
  bool first = true, slept = false;
  auto count_events = [&] {
    int count = 0;
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = virt[i] ? virtual_events(virt[i], fds[i].events, k[i].revents) : k[i].revents;
      count += fds[i].revents != 0;
    }
    return count;
  };
  for (;;) {
    k.resize(nfds + vidx.size() + connecting.size());
    // A handshake may have moved a direction to the ring since the last turn.
    bool answered = slept;
    for (nfds_t i = 0; i < nfds; ++i) {
      short want = virt[i] ? kernel_interest(virt[i], fds[i].events) : fds[i].events;
      answered = answered && k[i].fd == fds[i].fd && k[i].events == want;
    }
    if (!answered) {
      for (nfds_t i = 0; i < nfds; ++i) {
        k[i] = {fds[i].fd, virt[i] ? kernel_interest(virt[i], fds[i].events) : fds[i].events, 0};
      }
    }
    bool will_sleep = first && !expired(dl) && (vidx.empty() || !Spinner::would_spin());
    first = slept = false;
    if (!answered && !will_sleep) {
      if (sys::wait_as(how, k.data(), nfds, 0) < 0) return -1;
      answered = true;
    }
    int count = count_events();
    if (count > 0 && !answered) {  // a ring is ready: the kernel's events too, as always
      if (sys::wait_as(how, k.data(), nfds, 0) < 0) return -1;
      count = count_events();
    }
    if (count > 0 || expired(dl)) return count;
    bool all_virtual = vidx.size() == nfds;
    for (nfds_t v : vidx) all_virtual = all_virtual && !virt[v]->epoll && virt[v]->conn->on_ring();
    auto ring_ready = [&] {
      for (nfds_t v : vidx)
        if (virtual_events(virt[v], fds[v].events, 0)) return true;
      return false;
    };
    auto kernel_ready = [&] { return !all_virtual && sys::wait_as(how, k.data(), nfds, 0) > 0; };
    std::optional<Spinner> spin;
    if (!vidx.empty() && spin_for(spin.emplace(spin_deadline(dl)), ring_ready, kernel_ready)) continue;

    // Sleep: ask every virtual peer to ring, re-check, then wait on the
    // kernel descriptors and the doorbells together. Those still in the
    // handshake wake the kernel wait by their TCP bytes; an epoll set of
    // ours by its own descriptor (its doorbells are registered in it).
    // A handshake prefix's deadline ends the sleep early (its bytes turn
    // readable), as does a held first write's (Connection::wake_deadline).
    std::vector<Armed> armed;
    bool ready = false;
    int64_t wake = dl;
    std::optional<SleepingOnSets> sleeping;
    SleepKick kick;
    for (size_t j = 0; j < vidx.size(); ++j) {
      const Ref& v = virt[vidx[j]];
      k[nfds + j] = {-1, POLLIN, 0};
      if (v->epoll) {
        if (!sleeping) sleeping.emplace();
        ready = arm_all(*v->epoll, fds[vidx[j]].fd, armed, 1, wake, *sleeping) || ready;
      } else {
        wake = earliest(wake, v->conn->wake_deadline());
        if (!v->conn->on_ring() && !v->conn->passthrough()) kick.watch(*v->conn);
        if (v->conn->on_ring()) {
          unsigned what = v->conn->arm(fds[vidx[j]].events);
          armed.push_back({share(v.get()), what, static_cast<int>(nfds + j)});
          k[nfds + j].fd = v->conn->doorbell();
        }
        // After arming: a read in another thread taking a Switch in has
        // spent the kernel's edge, and maybe the doorbell's (look again soon).
        if (v->conn->setup_read_elsewhere()) wake = look_again_soon(wake);
      }
    }
    // A client still connecting, whatever the program asked of it: its
    // connect completing wakes us, to send the Hello (connecting.cc).
    for (size_t j = 0; j < connecting.size(); ++j) k[nfds + vidx.size() + j] = {fds[connecting[j]].fd, POLLOUT, 0};
    // Those an epoll set of ours among fds holds, appended (slots past nfds only).
    for (nfds_t i = 0; i < nfds; ++i) connecting_in_set(fds[i].fd, k, quiet);
    if (kick.fd() >= 0) k.push_back({kick.fd(), POLLIN, 0});  // last, taken off again after the sleep
    for (nfds_t v : vidx) ready = ready || virtual_events(virt[v], fds[v].events, 0) != 0;
    // A direction that left its ring meanwhile (a Downgrade read above) is the
    // kernel's again: what we ask of the kernel changed, so look again first.
    for (nfds_t v : vidx) ready = ready || kernel_interest(virt[v], fds[v].events) != k[v].events;
    int r = 0, err = 0;
    if (!ready) {
      int64_t sleep_dl = release_before_sleep(wake);
      if (how == sys::WaitCall::kPpoll) {
        timespec t = ts_left(sleep_dl);
        r = sys.ppoll(k.data(), k.size(), sleep_dl == kForever ? nullptr : &t, mask);
      } else {
        r = sys::wait_as(how, k.data(), k.size(), ms_left(sleep_dl), mask);
      }
      err = errno;
      slept = r >= 0;
      if (r < 0 && err == EINVAL && k.size() > nfds) {
        // Its answer covers the virtual descriptors only (the kick has no room).
        if (kick.fd() >= 0) k.pop_back(), kick.forget();
        r = sleep_within_nofile(k, vidx, connecting, nfds, sleep_dl, mask, how), err = errno;
      }
    }
    if (kick.fd() >= 0) {
      if (r > 0 && k.back().revents != 0) kick.drain();
      k.pop_back();
    }
    for (auto& a : armed) a.ref->conn->disarm(a.what, a.slot >= 0 && r > 0 && k[a.slot].revents != 0);
    if (sleeping) sleeping->end();
    if (spin && ring_ready()) spin->found();
    if (r < 0) {
      errno = err;
      return -1;  // EINTR included: poll is never restarted
    }
    if (r > 0 && k.size() > nfds + vidx.size()) settle_connects(fds, k, nfds, virt, vidx, connecting, quiet);
  }
}

bool any_managed_stream(const pollfd* fds, nfds_t nfds) {
  for (nfds_t i = 0; i < nfds; ++i)
    if (managed_stream(fds[i].fd) || watches_connect(fds[i].fd)) return true;
  return false;
}

// select and pselect: through poll_mixed when a virtual descriptor is set.
int select_mixed(int nfds, fd_set* r, fd_set* w, fd_set* e, int64_t dl, const sigset_t* mask, sys::WaitCall how) {
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (r && FD_ISSET(fd, r)) ev |= POLLIN;
    if (w && FD_ISSET(fd, w)) ev |= POLLOUT;
    if (e && FD_ISSET(fd, e)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  int n = poll_mixed(p.data(), p.size(), dl, mask, how);
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
      if (managed_stream(fd) || watches_connect(fd)) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" {

int poll(pollfd* fds, nfds_t nfds, int timeout) {
  sys::note_wait_call(sys::WaitCall::kPoll);
  if (nfds == 0 || !any_managed_stream(fds, nfds)) {
    release_before_plain_sleep(timeout != 0);
    return real().poll(fds, nfds, timeout);
  }
  return poll_mixed(fds, nfds, deadline_from_ms(timeout), nullptr, sys::WaitCall::kPoll);
}

int __poll_chk(pollfd* fds, nfds_t nfds, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < nfds) abort();  // glibc's __chk_fail, minus the message
  return poll(fds, nfds, timeout);
}

int ppoll(pollfd* fds, nfds_t nfds, const timespec* ts, const sigset_t* mask) {
  sys::note_wait_call(sys::WaitCall::kPpoll);
  // A bad timeout is the kernel's EINVAL before anything else.
  if (nfds == 0 || bad_timespec(ts) || !any_managed_stream(fds, nfds)) {
    release_before_plain_sleep(!ts || ts->tv_sec != 0 || ts->tv_nsec != 0);
    return real().ppoll(fds, nfds, ts, mask);
  }
  return poll_mixed(fds, nfds, deadline_from_ts(ts), mask, sys::WaitCall::kPpoll);
}

int __ppoll_chk(pollfd* fds, nfds_t nfds, const timespec* ts, const sigset_t* mask, size_t fdslen) {
  if (fdslen / sizeof(*fds) < nfds) abort();  // glibc's __chk_fail, minus the message
  return ppoll(fds, nfds, ts, mask);
}

int select(int nfds, fd_set* r, fd_set* w, fd_set* e, timeval* tv) {
  sys::note_wait_call(sys::WaitCall::kSelect);
  if ((tv && (tv->tv_sec < 0 || tv->tv_usec < 0)) || !select_has_managed_stream(nfds, r, w, e)) {
    release_before_plain_sleep(!tv || tv->tv_sec != 0 || tv->tv_usec != 0);
    return real().select(nfds, r, w, e, tv);
  }
  int64_t dl = tv ? static_cast<int64_t>(now_ns()) + tv->tv_sec * 1'000'000'000LL + tv->tv_usec * 1000LL : kForever;
  int n = select_mixed(nfds, r, w, e, dl, nullptr, sys::WaitCall::kSelect);
  if (tv) {  // Linux reports the time left
    int64_t left = std::max<int64_t>(0, dl - static_cast<int64_t>(now_ns()));
    tv->tv_sec = left / 1'000'000'000;
    tv->tv_usec = (left % 1'000'000'000) / 1000;
  }
  return n;
}

int pselect(int nfds, fd_set* r, fd_set* w, fd_set* e, const timespec* ts, const sigset_t* mask) {
  sys::note_wait_call(sys::WaitCall::kPselect);
  if (bad_timespec(ts) || !select_has_managed_stream(nfds, r, w, e)) {
    release_before_plain_sleep(!ts || ts->tv_sec != 0 || ts->tv_nsec != 0);
    return real().pselect(nfds, r, w, e, ts, mask);
  }
  return select_mixed(nfds, r, w, e, deadline_from_ts(ts), mask, sys::WaitCall::kPselect);
}

}  // extern "C"
