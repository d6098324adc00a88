// Link over a shared-memory Segment: put() is a memcpy into the peer's rx
// ring, cursors are atomics in the control page, and the doorbell is the
// waiting side's eventfd, rung only when that side announced it sleeps.
#pragma once

#include <cstring>
#include <memory>

#include "link/link.h"
#include "shm/segment.h"

namespace rdmashim::shm {

class ShmLink final : public Link {
 public:
  ShmLink(std::unique_ptr<Segment> segment, Side self);

  size_t ring_size() const override { return segment_->ring_size(); }
  void put(uint64_t offset, const void* src, size_t len) override;
  void publish_tail(uint64_t tail) override;
  uint64_t peer_head() override;
  const unsigned char* rx_data() const override { return rx_; }
  uint64_t peer_tail() override;
  void publish_head(uint64_t head) override;
  uint64_t own_tail() const override { return mine_.produced.value.load(std::memory_order_relaxed); }
  uint64_t own_head() const override { return mine_.consumed.value.load(std::memory_order_relaxed); }
  int wait_fd() const override { return segment_->doorbell(self_); }
  void prepare_sleep(unsigned what) override;
  void finish_sleep(unsigned what, bool rung) override;

  Segment& segment() { return *segment_; }
  void mark_attached();
  bool peer_attached() const;
  SideState& mine() { return mine_; }

  bool elastic() const override { return true; }
  uint64_t peer_map() override { return theirs_.produced.map.load(std::memory_order_acquire); }
  uint64_t own_map() const override { return mine_.produced.map.load(std::memory_order_relaxed); }
  void publish_map(uint64_t word) override { mine_.produced.map.store(word, std::memory_order_release); }
  void copy_tx(uint64_t dst, uint64_t src, size_t len) override { memcpy(tx_ + dst, tx_ + src, len); }
  bool release_tx(size_t len) override { return punch(tx_, len); }
  bool release_rx(size_t len) override { return punch(rx_, len); }

 private:
  static constexpr uint32_t kDataSleepers = 0xffff, kSpaceSleepers = 0xffff0000;
  void wake_peer(uint32_t who);
  static bool punch(unsigned char* ring, size_t len);

  std::unique_ptr<Segment> segment_;
  const Side self_;
  const Side peer_;
  SideState& mine_;
  SideState& theirs_;
  unsigned char* tx_;  // the peer's rx ring
  unsigned char* rx_;  // ours
};

}  // namespace rdmashim::shm
