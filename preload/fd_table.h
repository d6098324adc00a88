// The side table from descriptor number to what rdmashim knows about it.
//
// Lookups are lock-free for descriptors we do not track (one load, the hot
// path of every read() and write() on a file or pipe). For tracked ones a
// per-slot lock bit is held only while the entry's reference count is bumped,
// so a close() racing with a call in another thread can never free an entry
// that call is still using. A stream that settled on plain TCP for good is
// marked in its slot, so the data and epoll hooks skip it at the cost of an
// untracked one (get_unless_plain).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "conn/connection.h"
#include "discovery/remote.h"
#include "util/unique_fd.h"

namespace rdmashim::preload {

struct EpollSet;  // epoll_set.h

// Advertised clients still connecting (kPending entries with `advertised`)
// alive in this process: an epoll wait looks for them among a set's native
// registrations only while there are some (connecting.cc), not at every sleep.
inline std::atomic<int> g_connecting_clients{0};

struct Entry {
  enum class Kind : uint8_t {
    kListener,  // a listening TCP socket we advertised
    kPending,   // a client socket whose non-blocking connect is in progress
    kStream,    // a connection we may upgrade (or did)
    kEpoll,     // an epoll instance (see hooks_epoll.cc)
  };

  explicit Entry(Kind k) : kind(k) {}
  ~Entry() {
    if (counted_connecting) g_connecting_clients.fetch_sub(1, std::memory_order_relaxed);
  }
  std::atomic<int> refs{0};  // table slots plus calls in flight
  std::atomic<Kind> kind;
  UniqueFd advert;                   // kListener: keeps the registry entry alive
  std::unique_ptr<discovery::RemoteAdvert> remote;  // kListener: answers RDMA-CM probes (under mu)
  bool had_remote = false;  // kListener: `remote` was made, before the entry was published (read without mu)
  std::unique_ptr<Connection> conn;  // kStream
  std::shared_ptr<EpollSet> epoll;   // kEpoll
  // kStream: records of epoll sets that keep it after the program's DEL
  // (epoll_set.h); closing a name of it drops them.
  std::atomic<int> lingering{0};
  std::mutex mu;                     // guards the change kPending -> kStream
  sockaddr_storage peer{};           // kPending and client streams: where it connects
  socklen_t peer_len = 0;
  // A client's connect() time (now_ns()): its close tells discovery/short_lived.h
  // how long connections to `peer` live. 0: not a client of ours.
  uint64_t connected_ns = 0;
  bool advertised = false;           // kPending: the peer advertised before we connected
  bool counted_connecting = false;   // kPending: in g_connecting_clients until destroyed
  discovery::Announcement announce;  // kPending: our announcement (discovery::announce_client)
  std::atomic<bool> syns_kept{false};  // kListener: its SYNs are ours to read (discovery/syn_mark.h)
  discovery::RemoteProbe probe;      // kPending: another host's answer, asked before connect()
  // Descriptors (dup, dup2, ...) naming this socket; the connection uses one
  // that is open, so closing the original while a duplicate lives is fine.
  static constexpr int kMaxAliases = 16;
  int aliases[kMaxAliases];
  // Changed under mu; read without it where a stale answer only delays (an
  // epoll set's check for a closed stream: the next look sees it).
  std::atomic<int> alias_count{0};
};

class Ref {
 public:
  Ref() = default;
  explicit Ref(Entry* e) : e_(e) {}
  Ref(Ref&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Ref& operator=(Ref&& o) noexcept;
  Ref(const Ref&) = delete;
  ~Ref();
  Entry* operator->() const { return e_; }
  Entry* get() const { return e_; }
  explicit operator bool() const { return e_ != nullptr; }

 private:
  Entry* e_ = nullptr;
};

void unref(Entry* e);

// Another reference to an entry the caller already holds one to.
inline Ref share(Entry* e) {
  e->refs.fetch_add(1, std::memory_order_relaxed);
  return Ref(e);
}

class FdTable {
 public:
  constexpr FdTable() = default;
  static constexpr int kMaxFd = 1 << 22;

  // The entry for fd with a reference held, or empty.
  Ref get(int fd);
  // get(), but empty at the cost of one load for a slot marked plain.
  Ref get_unless_plain(int fd);
  // Marks fd's slot plain if it still holds e: a stream whose both
  // directions are raw TCP for good (or that never had a connection), whose
  // hooks only pass calls through. The entry stays (close() needs it).
  void mark_plain(int fd, const Entry* e);
  // Stores e for fd (taking a reference); returns false if fd is out of range.
  bool set(int fd, Entry* e);
  // Removes fd's entry and returns the table's reference to it (or nullptr).
  Entry* take(int fd);
  // In a child after fork(): no other thread exists, so no lock can be held.
  void reset_locks_after_fork();
  // Calls f(fd) for each descriptor that has an entry now (it may be gone
  // by the time f looks it up: f must use get()).
  template <typename F>
  void for_each_fd(F f) {
    for (int leaf = 0; leaf < kLeaves; ++leaf) {
      Slot* l = leaves_[leaf].load(std::memory_order_acquire);
      if (!l) continue;
      for (int i = 0; i < kLeafSize; ++i)
        if (l[i].load(std::memory_order_relaxed)) f(leaf * kLeafSize + i);
    }
  }
  // Calls f(Entry*) once per tracked entry. Only where no other thread runs.
  template <typename F>
  void for_each_unlocked(F f) {
    for (auto& leaf : leaves_) {
      Slot* l = leaf.load(std::memory_order_relaxed);
      if (!l) continue;
      for (int i = 0; i < kLeafSize; ++i) {
        uintptr_t v = l[i].load(std::memory_order_relaxed) & ~kFlagBits;
        if (v) f(reinterpret_cast<Entry*>(v));
      }
    }
  }

 private:
  static constexpr int kLeafBits = 10;
  static constexpr int kLeafSize = 1 << kLeafBits;
  static constexpr int kLeaves = kMaxFd / kLeafSize;
  // Entry* with bit 0 as the slot lock and bit 1 as the plain mark (Entry
  // is aligned to at least 8).
  using Slot = std::atomic<uintptr_t>;
  static constexpr uintptr_t kLockBit = 1, kPlainBit = 2, kFlagBits = kLockBit | kPlainBit;
  static_assert(alignof(Entry) > kFlagBits, "the flag bits are an Entry address's low bits");

  Slot* slot(int fd, bool create);
  static Slot* find(const std::atomic<Slot*>* leaves, int fd) {
    if (static_cast<unsigned>(fd) >= static_cast<unsigned>(kMaxFd)) return nullptr;
    Slot* l = leaves[fd >> kLeafBits].load(std::memory_order_acquire);
    return l ? &l[fd & (kLeafSize - 1)] : nullptr;
  }
  Ref get_locked(Slot& s);
  static uintptr_t lock(Slot& s);
  std::atomic<Slot*> leaves_[kLeaves] = {};
};

FdTable& table();

inline Ref FdTable::get(int fd) {
  Slot* s = find(leaves_, fd);
  if (!s || s->load(std::memory_order_relaxed) == 0) return Ref();  // the untracked fast path
  return get_locked(*s);
}

inline Ref FdTable::get_unless_plain(int fd) {
  Slot* s = find(leaves_, fd);
  if (!s) return Ref();
  uintptr_t v = s->load(std::memory_order_relaxed);
  if (v == 0 || (v & kPlainBit)) return Ref();
  return get_locked(*s);
}

}  // namespace rdmashim::preload
