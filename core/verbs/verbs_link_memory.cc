// VerbsLink's elastic memory (verbs/regions.h): the producer adopting the
// regions the consumer offers, the consumer growing its region under
// pressure and shrinking it when drained and idle, retiring the region the
// stream left, and the staging buffer growing and shrinking likewise.
#include <algorithm>

#include "util/log.h"
#include "util/process.h"
#include "verbs/verbs_link.h"

namespace rdmashim::verbs {

void VerbsLink::adopt_locked(std::unique_lock<std::mutex>& lock) {
  if (reserve_sq(lock, 1) != 0 || !tx_rgn_.offer_pending()) return;
  // The end of what was posted is the last tail the consumer saw: bytes
  // before it are in the old region, from it on in the new one.
  Ctl s = tx_rgn_.adopt(data_posted_end_);
  tx_offer_.store(false, std::memory_order_relaxed);
  tx_pressured_.store(false, std::memory_order_relaxed);
  post_ctl_locked(s);
}

void VerbsLink::offer_region(size_t size, bool budgeted, Room room, size_t fallback) {
  Buffer b;
  if (!dev_.take(size, true, &b, budgeted) && !(fallback && fallback < size && dev_.take(fallback, true, &b, budgeted))) {
    // Registration refused (the memory budget, the device's limits,
    // RLIMIT_MEMLOCK): we stay as we are, still correct, and the producer
    // reports no more pressure on this region.
    rx_rgn_.clear_pressure();
    RDMASHIM_DEBUG("verbs: registering a %zu-byte region failed: the ring stays at %zu", size, rx_rgn_.size());
    return;
  }
  std::unique_lock<std::mutex> lock(sq_mu_);
  if (reserve_sq(lock, 1, room) == -EAGAIN) {
    // No room for the offer now: nothing was offered, the pressure stays.
    lock.unlock();
    dev_.drop(b);
    return;
  }
  Ctl c = rx_rgn_.offer(b);
  c.rkey = b.mr->rkey;
  if (!error()) post_ctl_locked(c);
}

void VerbsLink::tend_regions(bool away) {
  // A writer found our region full while our program was away from the
  // socket: a bigger region, so the writer goes on filling as TCP's buffers
  // would be. Only once: the next offer waits until the reader has passed
  // the switch to this one. So a reader that is away gets at once what its
  // own calls would grow to in two steps (x16, at most the ring; x4 if the
  // budget refuses that): TCP's kernel buffers hold megabytes for a reader
  // that is away (2.6 MB in our guests), where x4 gave 1.25 MiB.
  // Never waiting: the heartbeat thread holds every link's lock.
  if (!rx_rgn_.pressure() || error() || sandbox() != Sandbox::kNone || !sq_has_room(1)) return;
  std::unique_lock<std::mutex> lock(offer_mu_, std::try_to_lock);
  if (lock.owns_lock() && rx_rgn_.can_offer() && rx_rgn_.pressure()) {
    const size_t grown = rx_rgn_.grown_size();
    offer_region(away ? rx_rgn_.grown_size(16) : grown, true, Room::kNoWait, grown);
  }
}

void VerbsLink::retire_rx() {
  Buffer old;
  {
    std::lock_guard<std::mutex> lock(offer_mu_);
    if (!rx_rgn_.retire(own_head(), &old)) return;
  }
  // A small region is worth keeping for the next shrink; a larger one is
  // what an idle connection is to give back.
  if (old.size <= kStartRegion) {
    dev_.give_back(old);
  } else {
    dev_.drop(old);
  }
}

uint64_t VerbsLink::maintain_staging(uint64_t now, bool grow_only) {
  if (old_tx_.mr && done_.load(std::memory_order_acquire) >= old_tx_until_) {
    dev_.drop(old_tx_);  // every write from it completed
    old_tx_ = Buffer{};
  }
  const size_t stage = stage_.load(std::memory_order_relaxed);
  const size_t small = std::min(ring_size_, kStartRegion);
  const uint64_t tail = own_tail();
  size_t want = stage;
  uint64_t due = 0;
  if (stage_short_.exchange(false, std::memory_order_relaxed)) {
    want = std::min({stage * 4, ring_size_, kStageBytes});
    tx_idle_since_ = 0;
  } else if (!grow_only && stage > small) {
    if (tail != idle_posted_ || tx_idle_since_ == 0) {
      idle_posted_ = tail;
      tx_idle_since_ = now;
    }
    if (now - tx_idle_since_ >= kIdleNs && done_.load(std::memory_order_acquire) == tail) {
      want = small;
    } else if (now - tx_idle_since_ >= kIdleNs) {
      // Unsignaled writes complete only with a signaled one behind them.
      if (signaled_end_.load(std::memory_order_relaxed) < tail) post_writes(0, 0, false, 0, true);
      due = now + 10'000'000;
    } else {
      due = tx_idle_since_ + kIdleNs;
    }
  }
  if (want == stage || old_tx_.mr) return due;  // one change in flight at a time
  Buffer b;
  if (!dev_.take(want, false, &b, want > stage)) return due;  // a larger one within the budget, or none
  // Positions from the tail on are staged in the new buffer; the old one
  // goes once the writes from it completed.
  old_tx_ = tx_;
  old_stage_ = stage;
  old_tx_until_ = tail;
  tx_ = b;
  stage_.store(want, std::memory_order_release);
  if (done_.load(std::memory_order_acquire) >= old_tx_until_) {
    dev_.drop(old_tx_);
    old_tx_ = Buffer{};
  }
  return due;
}

uint64_t VerbsLink::maintain(uint64_t now, bool tx_owned, bool rx_owned) {
  if (!connected_ || error()) return 0;
  poll_if_free();
  uint64_t due = 0;
  // Producer: adopt what the consumer offered (a smaller region only when
  // no write is under way: it might not hold what a writer was promised).
  if (tx_offer_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(sq_mu_);
    if (tx_rgn_.offer_pending() && (tx_owned || tx_rgn_.offered_size() >= tx_rgn_.size())) adopt_locked(lock);
  }
  if (tx_owned) due = maintain_staging(now, false);
  // Consumer.
  if (rx_owned && rx_rgn_.switched()) retire_rx();
  std::lock_guard<std::mutex> lock(offer_mu_);
  if (!rx_rgn_.can_offer()) return due;
  if (rx_rgn_.pressure()) {
    offer_region(rx_rgn_.grown_size(), true);
    return due;
  }
  const size_t small = std::min(ring_size_, kStartRegion);
  if (rx_rgn_.size() <= small) return due;
  // Drained and nothing new for kIdleNs: back to a small region.
  uint64_t tail = peer_tail_.load(std::memory_order_acquire);
  if (own_head() != tail) {
    idle_since_ = 0;  // unread bytes: the next read, then sleep, starts the clock
    return due;
  }
  if (tail != idle_tail_ || idle_since_ == 0) {
    idle_tail_ = tail;
    idle_since_ = now;
  }
  if (now - idle_since_ >= kIdleNs) {
    offer_region(small, false);
    idle_since_ = 0;
    return due;
  }
  uint64_t at = idle_since_ + kIdleNs;
  return due == 0 || at < due ? at : due;
}

}  // namespace rdmashim::verbs
