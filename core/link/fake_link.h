// An in-process link pair for unit tests, with the faults a real transport
// may show injected on demand:
//  - late placement: put() bytes land only at publish_tail(), and the ring
//    region is scribbled first, as an RDMA write may place out of order;
//  - bad cursors: the peer publishes positions that break the protocol;
//  - a link error;
//  - a staging limit (put_room), as a verbs link's send staging imposes.
// Both ends live in one FakeLinkPair; each end is a Link.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "link/link.h"

namespace rdmashim {

class FakeLinkPair {
 public:
  class End final : public Link {
   public:
    size_t ring_size() const override { return pair_->size_; }
    size_t tx_limit() const override { return tx_limit_knob != 0 ? tx_limit_knob : pair_->size_; }
    void put(uint64_t offset, const void* src, size_t len) override {
      unsigned char* dst = peer().rx_.data() + offset;
      if (pair_->late_placement) {
        memset(dst, 0xEE, len);  // garbage until published
        pending_.push_back({offset, std::vector<unsigned char>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + len)});
      } else {
        memcpy(dst, src, len);
      }
    }
    void publish_tail(uint64_t tail) override {
      for (auto& p : pending_) memcpy(peer().rx_.data() + p.offset, p.bytes.data(), p.bytes.size());
      pending_.clear();
      true_tail_ = tail;
      tail_ = tail + bogus_tail_delta;
      ++publishes;
      ring(peer());
    }
    uint64_t peer_head() override { return peer().head_; }
    uint64_t own_tail() const override { return true_tail_; }
    uint64_t own_head() const override { return true_head_; }
    const unsigned char* rx_data() const override { return rx_.data(); }
    uint64_t peer_tail() override { return peer().tail_; }
    void publish_head(uint64_t head) override {
      true_head_ = head;
      head_ = head + bogus_head_delta;
      ring(peer());
    }
    int wait_fd() const override { return efd_; }
    void prepare_sleep(unsigned) override { sleeping_ = true; }
    void finish_sleep(unsigned, bool) override {
      sleeping_ = false;
      uint64_t v;
      ssize_t r = ::read(efd_, &v, sizeof v);
      (void)r;
    }
    int error() const override { return pair_->error; }
    size_t put_room() override { return pair_->put_room; }

    size_t tx_limit_knob = 0;  // 0: the whole ring
    // Fault knobs for this end's published cursors.
    int64_t bogus_tail_delta = 0;
    int64_t bogus_head_delta = 0;
    int publishes = 0;

    ~End() override {
      if (efd_ >= 0) ::close(efd_);
    }

   private:
    friend class FakeLinkPair;
    struct Pending {
      uint64_t offset;
      std::vector<unsigned char> bytes;
    };
    End& peer() { return this == &pair_->a ? pair_->b : pair_->a; }
    static void ring(End& e) {
      if (e.sleeping_) {
        uint64_t one = 1;
        ssize_t r = ::write(e.efd_, &one, sizeof one);
        (void)r;
      }
    }
    FakeLinkPair* pair_ = nullptr;
    std::vector<unsigned char> rx_;
    std::vector<Pending> pending_;
    uint64_t tail_ = 0;  // what this end produced into the peer
    uint64_t head_ = 0;  // what this end consumed of its rx
    uint64_t true_tail_ = 0, true_head_ = 0;  // the same without injected faults
    bool sleeping_ = false;
    int efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  };

  explicit FakeLinkPair(size_t ring_size) : size_(ring_size) {
    for (End* e : {&a, &b}) {
      e->pair_ = this;
      e->rx_.assign(ring_size, 0);
    }
  }
  FakeLinkPair(const FakeLinkPair&) = delete;
  FakeLinkPair& operator=(const FakeLinkPair&) = delete;

  bool late_placement = false;
  int error = 0;
  size_t put_room = SIZE_MAX;  // a staging link's free staging (verbs)
  End a, b;

 private:
  size_t size_;
};

}  // namespace rdmashim
