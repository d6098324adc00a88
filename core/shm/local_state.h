// What only our side's processes may write, in memory the peer cannot map.
//
// The segment is shared with the peer, so nothing in it may decide whether
// we block, spin or wait: a peer that wrote our lock owner or sharing count
// there could freeze us (issue 12). The sharing count and cross-process
// locks of forked siblings, which directions they switched, the options
// generation, how many of our threads sleep on the doorbell and our own
// cursors live here
// instead: a one-page memfd this side creates and never hands to the peer,
// mapped MAP_SHARED so forked children share it, and kept open so exec can
// hand it on (ShmTransport::describe_for_exec).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "util/unique_fd.h"

namespace rdmashim::shm {

struct LocalState {
  uint64_t magic;  // kLocalMagic, checked when adopted across exec
  // Processes using this side (after fork), and the direction locks they
  // take while more than one does (a holder's pid, 0 when free).
  std::atomic<uint32_t> users{1};
  std::atomic<int32_t> rx_owner{0};
  std::atomic<int32_t> tx_owner{0};
  // Which directions passed their Switch, in whichever process did it: its
  // siblings follow without seeing the frame themselves.
  std::atomic<uint32_t> rx_switched{0};
  std::atomic<uint32_t> tx_switched{0};
  // Bumped by a process that changed the socket's options (O_NONBLOCK,
  // timeouts, SO_RCVLOWAT): its siblings re-read their caches.
  std::atomic<uint32_t> options_gen{0};
  // Set once a second process used this side: a process left alone again
  // still re-reads the cursors its siblings moved.
  std::atomic<uint32_t> ever_shared{0};
  // Our threads about to sleep on the doorbell (SideState::sleepers' units):
  // the last one out drains it. The segment's copy only tells the peer
  // whether to ring; the peer can write that one.
  std::atomic<uint32_t> sleepers{0};
  // Datagrams we read from our doorbell; the peer's SideState::rings says
  // how many it wrote (a hint: a lie costs one read that finds nothing).
  std::atomic<uint64_t> drained{0};
  // The peer's Downgrade of our rx, read by whichever of our processes: the
  // ring stream ends at rx_left_at - 1 (0: not left), and a sibling that
  // never saw the frame follows from here.
  std::atomic<uint64_t> rx_left_at{0};
  // What we last published in the segment (SideState::produced, its map
  // word, consumed): our own positions, as the peer cannot rewrite them.
  alignas(64) std::atomic<uint64_t> produced{0};
  std::atomic<uint64_t> map{0};
  alignas(64) std::atomic<uint64_t> consumed{0};
  // The most of our own stream the ring may hold unconsumed, when less than
  // the ring (0: the whole ring). A server whose client's larger send
  // buffer made the ring larger keeps its own writes to what it would have
  // buffered alone: the client cannot make it hold more than on TCP.
  std::atomic<uint64_t> tx_limit{0};
};

constexpr uint64_t kLocalMagic = 0x6c61636f'6c6d6873ull;  // "shmlocal", loosely
constexpr size_t kLocalBytes = 4096;
static_assert(sizeof(LocalState) <= kLocalBytes);

class LocalPage {
 public:
  // A fresh page. nullptr with *err (a negative errno) on failure.
  static std::unique_ptr<LocalPage> create(int* err);
  // The page a previous image of this process handed over across exec.
  static std::unique_ptr<LocalPage> adopt(UniqueFd fd, int* err);
  ~LocalPage();
  LocalPage(const LocalPage&) = delete;
  LocalPage& operator=(const LocalPage&) = delete;

  LocalState& state() const { return *state_; }
  int fd() const { return fd_.get(); }
  // As Segment::close_memfd/reopen_memfd: the descriptor is needed only to
  // follow exec, and dropped only where it can be reopened from the mapping.
  void close_fd();
  int reopen_fd();

 private:
  LocalPage() = default;
  bool map(int* err);
  LocalState* state_ = nullptr;
  UniqueFd fd_;
};

}  // namespace rdmashim::shm
