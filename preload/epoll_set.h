// The epoll emulation's data: what we keep about one epoll set of ours
// (EpollSet) and about each upgradable socket, or nested set of ours,
// registered in it (EpollReg). The epoll hooks (hooks_epoll.cc) keep it; the
// poll family (hooks_poll.cc) waits on such a set as one descriptor through
// the three calls declared at the end.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "preload.h"

namespace rdmashim::preload {

// Sets nest at most this deep (the kernel's EP_MAX_NESTS).
constexpr int kMaxEpollDepth = 5;

// What we keep about one upgradable socket (or one epoll set of ours that
// holds such sockets: nesting) in one epoll set.
struct EpollReg {
  int fd;
  Ref entry;              // keeps the Connection (or the inner EpollSet) alive while registered
  uint32_t events;        // the application's mask, flags included
  epoll_data_t data;      // returned untouched
  bool disabled = false;  // EPOLLONESHOT fired; MOD re-arms
  bool doorbell_added = false;
  // Edge-trigger state: what we saw at the last check.
  uint32_t last_ready = 0;
  uint64_t last_rx = 0, last_tx = 0;
  EpollSet* inner() const { return entry->epoll.get(); }
};

// A registration the kernel holds natively for a socket that may still
// become an upgradable stream (added before connect() completed).
struct NativeReg {
  int fd;
  epoll_event ev;
};

// All of it under mu. Registrations change only through add() and the
// removals, which keep the indexes: epoll_ctl runs per request in event
// loops (redis-benchmark makes five calls per request) and a set may hold
// thousands, so finding one is never a scan.
struct EpollSet {
  std::mutex mu;
  std::vector<std::unique_ptr<EpollReg>> regs;
  std::vector<NativeReg> natives;
  int rotate = 0;          // fairness among our registrations when more are ready than fit
  bool virt_owed = false;  // ours were ready but the kernel's filled maxevents: ours go first next time
  uint64_t tag() const { return reinterpret_cast<uintptr_t>(this); }

  EpollReg* find(int fd) const {
    auto it = by_fd_.find(fd);
    return it == by_fd_.end() ? nullptr : it->second;
  }
  EpollReg* add(std::unique_ptr<EpollReg> r) {
    EpollReg* p = r.get();
    by_fd_[p->fd] = p;
    ++per_entry_[p->entry.get()];
    regs.push_back(std::move(r));
    return p;
  }
  void remove(EpollReg* r) {
    remove_if([r](const EpollReg& x) { return &x == r; });
  }
  template <class Pred>
  void remove_if(Pred pred) {
    std::erase_if(regs, [&](std::unique_ptr<EpollReg>& r) {
      if (!pred(*r)) return false;
      forget(*r);
      return true;
    });
  }
  // How many registrations (the fd and its dups) name this stream or set.
  int registrations_of(const Entry* e) const {
    auto it = per_entry_.find(e);
    return it == per_entry_.end() ? 0 : it->second;
  }

 private:
  void forget(const EpollReg& r) {
    auto f = by_fd_.find(r.fd);
    if (f != by_fd_.end() && f->second == &r) by_fd_.erase(f);
    auto e = per_entry_.find(r.entry.get());
    if (e != per_entry_.end() && --e->second == 0) per_entry_.erase(e);
  }
  std::unordered_map<int, EpollReg*> by_fd_;
  std::unordered_map<const Entry*, int> per_entry_;
};

// An epoll set of ours as a descriptor poll() and select() wait on
// (defined in hooks_epoll.cc). `depth` counts the nesting of sets.
bool has_regs(EpollSet& s);
short set_events(EpollSet& s, short want, short kernel, int depth);
// A TCP socket not connected (yet), which may become a stream (connecting.cc).
bool may_become_stream(int fd);
// One armed connection of a sleep: what it armed, and the slot of its
// doorbell in a poll() array (-1: in an epoll set, edge-triggered).
struct Armed {
  Ref ref;
  unsigned what;
  int slot;
};
// arm_all also brings `wake` forward to the earliest handshake prefix deadline.
bool arm_all(EpollSet& set, int epfd, std::vector<Armed>& armed, int depth, int64_t& wake);

}  // namespace rdmashim::preload
