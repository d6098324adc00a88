// Link over a shared-memory Segment: put() is a memcpy into the peer's rx
// ring, cursors are atomics in the control page, and the doorbell is a
// datagram socket of our own connected to the peer's (rendezvous.h), rung
// only when the peer announced a sleep we did not ring for yet.
#pragma once

#include <cstring>
#include <memory>

#include "link/link.h"
#include "shm/local_state.h"
#include "shm/segment.h"

namespace rdmashim::shm {

class ShmLink final : public Link {
 public:
  ShmLink(std::unique_ptr<Segment> segment, std::unique_ptr<LocalPage> local, UniqueFd doorbell, Side self);

  size_t ring_size() const override { return segment_->ring_size(); }
  size_t tx_limit() const override {
    uint64_t limit = local().tx_limit.load(std::memory_order_relaxed);
    return limit != 0 && limit < ring_size() ? limit : ring_size();
  }
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
  void finish_sleep(unsigned what, bool rung) override;
  void finish_edge_sleep(unsigned what) override;
  uint64_t edge_key() const override { return key_; }
  bool waits_beside_peer(int cpu) override;

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
  void wake_peer(uint64_t who);
  // Ends one thread's sleep: true if no other thread of ours sleeps now.
  bool last_out(unsigned what);
  void settle(bool last, bool rung, bool edge);
  void drain(uint64_t rings);
  static bool punch(unsigned char* ring, size_t len);

  std::unique_ptr<Segment> segment_;
  std::unique_ptr<LocalPage> local_;
  UniqueFd doorbell_;
  std::atomic<uint32_t> rung_sleep_{0};  // the peer's sleep count we last rang for
  const uint64_t key_;                   // edge_key()
  const Side self_;
  const Side peer_;
  SideState& mine_;
  SideState& theirs_;
  unsigned char* tx_;  // the peer's rx ring
  unsigned char* rx_;  // ours
};

}  // namespace rdmashim::shm
