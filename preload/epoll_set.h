// The epoll emulation's data: what we keep about one epoll set of ours
// (EpollSet) and about each upgradable socket, or nested set of ours,
// registered in it (EpollReg). The epoll hooks (hooks_epoll.cc) keep it; the
// poll family (hooks_poll.cc) waits on such a set as one descriptor through
// the three calls declared at the end.
#pragma once

#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "preload.h"
#include "util/kick.h"

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
  // Deleted by the program, kept for the kernel: event loops delete and add
  // a socket per request (redis-benchmark: two of each), and re-adding a
  // lingering record costs no system call. Invisible to the program
  // (ENOENT, never reported); gone when its socket closes or turns plain.
  bool lingering = false;
  uint32_t kernel_events = 0;  // what the kernel's registration under our tag asks for
  // The kernel's registration of our socket carries this record's own tag
  // (EpollSet::tag_of), so an edge there (a FIN, RST or control frame on
  // the TCP side of a socket on its ring) names it. Until one comes, a
  // look finds its TCP side quiet without asking the kernel.
  uint32_t slot = 0;         // 0: none, the set's shared tag (looked at every time)
  bool kernel_hot = true;    // an edge came since a look found the TCP side quiet (or new)
  bool unseen_edge = false;  // and no look since: the set must look before it sleeps
  // What the kernel's epoll_wait said of our tag: the socket's readiness
  // then, in the look it numbers (EpollSet::look). The scan of that same look
  // takes it for the answer a poll would give (one call less per wakeup).
  uint32_t harvested = 0;
  uint64_t harvest_look = 0;
  uint64_t plain_since = 0;  // the wait (EpollSet::waits) that first found it settled plain; 0: not yet
  // The program's ADD of a fresh server socket, not made in the kernel yet
  // (hooks_epoll.cc, may_defer): the next wait's look for a Hello says
  // whether it is readable, and a short connection is closed before the
  // kernel ever needs it. `deferred_look`: the wait that looked; 0: none yet.
  bool deferred = false;
  uint64_t deferred_look = 0;
  // Edge-trigger state: what we saw at the last check.
  uint32_t last_ready = 0;
  uint64_t last_rx = 0, last_tx = 0;
  EpollSet* inner() const { return entry->epoll.get(); }
};

// Registrations by descriptor number, in leaves of 1024 numbers made on
// first use: an event loop adds and deletes a socket per request, and a
// hash map's node for each cost more than the rest of that epoll_ctl.
class FdIndex {
 public:
  EpollReg* get(int fd) const {
    auto u = static_cast<unsigned>(fd);
    size_t leaf = u >> kLeafBits;
    return leaf < leaves_.size() && leaves_[leaf] ? leaves_[leaf][u & kLeafMask] : nullptr;
  }
  void put(int fd, EpollReg* r) {
    auto u = static_cast<unsigned>(fd);  // a descriptor the kernel accepted: never negative
    size_t leaf = u >> kLeafBits;
    if (leaf >= leaves_.size()) leaves_.resize(leaf + 1);
    if (!leaves_[leaf]) leaves_[leaf].reset(new EpollReg* [kLeafSize] {});
    leaves_[leaf][u & kLeafMask] = r;
  }
  void clear(int fd, const EpollReg* r) {  // only if it still names r
    auto u = static_cast<unsigned>(fd);
    size_t leaf = u >> kLeafBits;
    if (leaf < leaves_.size() && leaves_[leaf] && leaves_[leaf][u & kLeafMask] == r) leaves_[leaf][u & kLeafMask] = nullptr;
  }

 private:
  static constexpr unsigned kLeafBits = 10, kLeafSize = 1u << kLeafBits, kLeafMask = kLeafSize - 1;
  std::vector<std::unique_ptr<EpollReg*[]>> leaves_;
};

// One armed connection of a sleep: what it armed, and the slot of its
// doorbell in a poll() array, or where in the epoll sets it sits
// (edge-triggered): in the one waited on, or in a set nested there.
constexpr int kInWaitedSet = -1, kInNestedSet = -2;
struct Armed {
  Ref ref;
  unsigned what;
  int slot;
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
//
// Tags, the epoll_data of the kernel's registrations of ours, are addresses
// inside tag_space_, a block this set owns, so no value of the program's
// (its pointers, its numbers) can be one: tag() for the doorbells, and
// tag() + slot for a record. A tag whose record is gone (an event queued
// before it went, or a socket still open in a deferred close) is still
// ours, and dropped.
struct EpollSet : std::enable_shared_from_this<EpollSet> {
  static constexpr uint32_t kTagSlots = 16384;  // records beyond it share tag()

  std::mutex mu;
  // Threads asleep on this set (or on one it is nested in), counted from
  // arm_all until they wake (SleepingOnSets), and what epoll_ctl armed for
  // them meanwhile: they armed the records they found, and a socket on its
  // rings added, re-armed or asked for more since would ring no doorbell
  // (asio registers sockets from its handlers while its reactor thread
  // sleeps). The last of them to wake disarms it.
  int sleepers = 0;
  std::vector<Armed> armed_for_sleepers;
  // In the kernel's set under tag(), made at the first sleep that found a
  // socket not on its rings yet (Connection::watch_switch); counts the
  // sleepers as they come and go. kick_refused: none could be made.
  std::shared_ptr<Kick> kick;
  bool kick_refused = false;
  std::vector<std::unique_ptr<EpollReg>> regs;
  std::vector<NativeReg> natives;
  int rotate = 0;          // fairness among our registrations when more are ready than fit
  bool virt_owed = false;  // ours were ready but the kernel's filled maxevents: ours go first next time
  uint64_t look = 1;       // numbers the looks; a harvest counts only in its own (EpollReg::harvested)
  uint64_t waits = 1;      // numbers the program's waits on the set
  // Deferred ADDs pay when the look finds the socket readable (a call
  // saved) and cost one when it finds nothing (the look, then the ADD and a
  // second look): looks that found nothing, less those that found bytes,
  // within [0, kDeferScoreMax]. From kDeferOff on, one ADD in 16 is
  // deferred, to keep measuring (a server whose clients wait for its
  // greeting).
  static constexpr int kDeferOff = 8, kDeferScoreMax = 16;
  int defer_score = 0;
  bool deferred_unlooked = false;  // a deferred ADD may wait for its look (look_deferred walks only then)
  uint32_t defer_turn = 0;
  bool defer_wanted() { return defer_score < kDeferOff || (++defer_turn & 15) == 0; }
  void deferred_looked(bool readable) {
    defer_score = readable ? std::max(defer_score - 1, 0) : std::min(defer_score + 1, kDeferScoreMax);
  }
  // scan_virtual's buffers, kept so that a look (one per wakeup of an event
  // loop) allocates nothing.
  std::vector<pollfd> scan_all, scan_asked;
  std::vector<size_t> scan_of;

  // Without the block (no memory) every record shares the set's address.
  uint64_t tag() const {
    return tag_space_ ? reinterpret_cast<uintptr_t>(tag_space_.get()) : reinterpret_cast<uintptr_t>(this);
  }
  uint64_t tag_of(const EpollReg& r) const { return tag() + r.slot; }
  bool ours(uint64_t data) const { return tag_space_ ? data - tag() <= kTagSlots : data == tag(); }
  // The record a tag of ours names, if it still lives and has a tag of its own.
  EpollReg* by_tag(uint64_t data) const {
    uint64_t slot = data - tag();
    return slot != 0 && slot < slots_.size() ? slots_[slot] : nullptr;
  }

  ~EpollSet() {
    for (auto& r : regs) unlinger(*r);
  }
  // The program deleted r; it stays for the kernel (EpollReg::lingering).
  void linger(EpollReg& r) {
    if (!r.lingering) r.entry->lingering.fetch_add(1, std::memory_order_relaxed);
    r.lingering = true;
  }
  void unlinger(EpollReg& r) {
    if (r.lingering) r.entry->lingering.fetch_sub(1, std::memory_order_relaxed);
    r.lingering = false;
  }

  EpollReg* find(int fd) const { return by_fd_.get(fd); }
  EpollReg* add(std::unique_ptr<EpollReg> r) {
    EpollReg* p = r.get();
    if (!free_slots_.empty()) {
      p->slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[p->slot] = p;
    } else if (tag_space_ && slots_.size() < kTagSlots) {
      if (slots_.empty()) slots_.push_back(nullptr);  // slot 0 is tag() itself
      p->slot = static_cast<uint32_t>(slots_.size());
      slots_.push_back(p);
    }
    by_fd_.put(p->fd, p);
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
  // How many registrations (the fd and its dups) name this stream.
  int registrations_of(Entry* e) const {
    std::lock_guard<std::mutex> l(e->mu);
    int n = 0;
    for (int i = 0; i < e->alias_count; ++i) {
      EpollReg* r = find(e->aliases[i]);
      n += r && r->entry.get() == e;
    }
    return n;
  }

 private:
  void forget(EpollReg& r) {
    unlinger(r);
    if (r.slot != 0) {
      slots_[r.slot] = nullptr;
      free_slots_.push_back(r.slot);
    }
    by_fd_.clear(r.fd, &r);
  }
  std::unique_ptr<char[]> tag_space_{new (std::nothrow) char[kTagSlots + 1]};
  std::vector<EpollReg*> slots_;
  std::vector<uint32_t> free_slots_;
  FdIndex by_fd_;
};

// An epoll set of ours as a descriptor poll() and select() wait on
// (defined in hooks_epoll.cc). `depth` counts the nesting of sets.
bool has_regs(EpollSet& s);
short set_events(EpollSet& s, short want, short kernel, int depth);
// A TCP socket not connected (yet), which may become a stream (connecting.cc).
bool may_become_stream(int fd);

// Held by a thread from before it arms a set of ours (arm_all) until its
// sleep ends. While none is held, epoll_ctl may leave the kernel's
// registration as it is (a MOD or an add that changes only our record):
// its only other effect would be to wake a sleeper. Each set armed under
// it counts the sleeper (EpollSet::sleepers) until end().
class SleepingOnSets {
 public:
  SleepingOnSets();
  ~SleepingOnSets();
  SleepingOnSets(const SleepingOnSets&) = delete;
  SleepingOnSets& operator=(const SleepingOnSets&) = delete;
  static bool anyone();
  void enter(EpollSet& s);  // s.mu held
  void end();               // awake: no longer counted on its sets
 private:
  // The set waited on, and those nested in it (a sleep on one set allocates nothing).
  std::shared_ptr<EpollSet> first_;
  std::vector<std::shared_ptr<EpollSet>> more_;
};

// arm_all also brings `wake` forward to the earliest handshake prefix deadline.
bool arm_all(EpollSet& set, int epfd, std::vector<Armed>& armed, int depth, int64_t& wake, SleepingOnSets& sleep);

}  // namespace rdmashim::preload
