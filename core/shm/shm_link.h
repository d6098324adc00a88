// Link over a shared-memory Segment: put() is a memcpy into the peer's rx
// ring, cursors are atomics in the control page, and the doorbell is a
// datagram socket of our own connected to the peer's (rendezvous.h), rung
// only when the peer announced a sleep we did not ring for yet.
#pragma once

#include <cstring>
#include <memory>
#include <mutex>

#include "link/link.h"
#include "shm/local_state.h"
#include "shm/segment.h"

namespace rdmashim::shm {

class ShmLink final : public Link {
 public:
  ShmLink(std::unique_ptr<Segment> segment, std::unique_ptr<LocalPage> local, UniqueFd doorbell, Side self);

  size_t ring_size() const override { return segment_->ring_size(); }
  void put(uint64_t offset, const void* src, size_t len) override;
  void publish_tail(uint64_t tail) override;
  uint64_t peer_head() override;
  const unsigned char* rx_data() const override { return rx_; }
  uint64_t peer_tail() override;
  void publish_head(uint64_t head) override;
  // Our own positions come from our local page, never from the segment the
  // peer can write: readiness compares them with the peer's, and a sibling
  // resyncs from them.
  uint64_t own_tail() const override { return local().produced.load(std::memory_order_relaxed); }
  uint64_t own_head() const override { return local().consumed.load(std::memory_order_relaxed); }
  int wait_fd() const override { return doorbell_.get(); }
  void prepare_sleep(unsigned what) override;
  void finish_sleep(unsigned what, bool rung) override { finish(what, rung, false); }
  void finish_edge_sleep(unsigned what) override { finish(what, false, true); }
  void drop_stale() override;
  void pin_socket(int tcp_fd) override;
  bool sleep_edge(unsigned what, int tcp_fd, short tcp_events, int timeout_ms, short* revents, int* result) override;

  Segment& segment() { return *segment_; }
  void mark_attached();
  bool peer_attached() const;
  LocalState& local() const { return local_->state(); }
  LocalPage& local_page() const { return *local_; }

  bool elastic() const override { return true; }
  uint64_t peer_map() override { return theirs_.produced.map.load(std::memory_order_acquire); }
  uint64_t own_map() const override { return local().map.load(std::memory_order_relaxed); }
  void publish_map(uint64_t word) override {
    local().map.store(word, std::memory_order_relaxed);
    mine_.produced.map.store(word, std::memory_order_release);
  }
  void copy_tx(uint64_t dst, uint64_t src, size_t len) override { memcpy(tx_ + dst, tx_ + src, len); }
  bool release_tx(size_t len) override { return punch(tx_, len); }
  bool release_rx(size_t len) override { return punch(rx_, len); }

 private:
  static constexpr uint64_t kDataSleepers = 0xffff, kSpaceSleepers = 0xffff0000, kOneSleep = uint64_t{1} << 32;
  // An edge-triggered sleeper drains once this many rings are queued, at
  // most a quarter of what the queue holds: a one-byte datagram costs its
  // sender ~770 bytes of SO_SNDBUF (~270 at the default 208 KiB), and a ring
  // that finds the queue full is lost to an edge-triggered sleeper.
  static constexpr int64_t kLazyDrain = 64;
  static constexpr int kBytesPerRing = 770;
  int64_t lazy_drain() const;
  void wake_peer(uint64_t who);
  void finish(unsigned what, bool rung, bool edge);
  void drain(int64_t n, uint64_t rings);
  bool edge_set(int tcp_fd, short tcp_events);
  static bool punch(unsigned char* ring, size_t len);

  std::unique_ptr<Segment> segment_;
  std::unique_ptr<LocalPage> local_;
  UniqueFd doorbell_;
  std::atomic<uint32_t> rung_sleep_{0};  // the peer's sleep count we last rang for
  // sleep_edge's epoll set (made at the first such sleep): the doorbell
  // edge-triggered, the TCP socket with ep_events_. Used by one sleeper at a
  // time (edge_mu_, and the sole-sleeper check across forked siblings).
  std::mutex edge_mu_;
  std::mutex drain_mu_;  // one drainer at a time: each reads only what it counted
  UniqueFd epfd_;
  int ep_tcp_ = -1;
  short ep_events_ = 0;
  bool edge_off_ = false;  // the set could not be made or kept: poll
  // An epoll set holds no reference to the files in it: once the program
  // closed the socket, a sleeper in epoll_wait would lose it (and its FIN)
  // where poll() keeps it open. pin_socket() keeps a duplicate for the
  // sleepers in flight (a Dekker pair: closing_ / edge_active_); later
  // sleeps poll.
  std::atomic<bool> closing_{false};
  std::atomic<int> edge_active_{0};
  UniqueFd pinned_;
  const Side self_;
  const Side peer_;
  SideState& mine_;
  SideState& theirs_;
  unsigned char* tx_;  // the peer's rx ring
  unsigned char* rx_;  // ours
};

}  // namespace rdmashim::shm
