// VerbsLink's data path: put and publish (RDMA WRITE WITH IMM), credits,
// taking completions from the shared CQ, flushing, sleeping on the link's
// doorbell, and the idle heartbeat's credit. Setup is in verbs_link_setup.cc.
#include "verbs/verbs_link.h"

#include <arpa/inet.h>
#include <sched.h>

#include <cerrno>
#include <cstring>

#include "sys/sys.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/stats.h"
#include "verbs/ibv_api.h"

namespace rdmashim::verbs {

void VerbsLink::heartbeat_if_idle() {
  // A beat is signaled, and on an idle link the next one is posted only
  // once it completed: a peer gone without a Bye (SIGKILL, a crash) gets
  // one, which rxe retries until the link closes, not one more a minute.
  if (beat_pending_) {
    if (!cq_->mu.try_lock()) return;  // a thread of ours is polling: look next time
    poll_completions();
    cq_->mu.unlock();
    std::lock_guard<std::mutex> lock(sq_mu_);
    if (outstanding_.load(std::memory_order_relaxed) != 0 && posts_ == posts_at_beat_) return;  // its QP does not answer
    beat_pending_ = false;
  }
  uint64_t posts;
  {
    std::lock_guard<std::mutex> lock(sq_mu_);
    posts = posts_;
  }
  if (posts == posts_at_beat_ && !error() && !peer_bye_.load(std::memory_order_acquire)) {
    // Our consumed position again: a valid credit the peer already has, or
    // newer. Not into a full send queue: this thread holds g_links_mu, and
    // waiting for room a dead peer never gives would stall every link's
    // setup and teardown in the process (its writes already probe it).
    beat_pending_ = post_credit(true) == 0;
    if (beat_pending_) {
      stats::VerbsResources beat;
      beat.beats = 1;
      stats::verbs_add(beat);
    }
    std::lock_guard<std::mutex> lock(sq_mu_);
    posts = posts_;
  }
  posts_at_beat_ = posts;
}

uint64_t VerbsLink::widen(uint64_t old, uint32_t low31) {
  uint32_t delta = (low31 - static_cast<uint32_t>(old)) & 0x7fffffffu;
  return old + delta;
}

void VerbsLink::repost_receives(int n) {
  // One control slot per receive, in posting order: an RC receive queue
  // completes in that order, so a slot is reposted only once read. A WRITE
  // WITH IMM consumes one too and places nothing there.
  auto* slots = static_cast<char*>(ctl_.data);
  for (int i = 0; i < n; ++i) {
    uint32_t slot = recv_slot_++ % kRecvDepth;
    ibv_sge sge{reinterpret_cast<uintptr_t>(slots + slot * sizeof(Ctl)), sizeof(Ctl), ctl_.mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(qp_, &wr, &bad) != 0) {
      error_.store(-EIO, std::memory_order_relaxed);
      return;
    }
  }
}

void VerbsLink::on_control(const Ctl& c) {
  bool ok = true;
  if (c.kind == kCtlOffer) {
    std::lock_guard<std::mutex> lock(sq_mu_);
    ok = tx_rgn_.offer(c);
    if (ok) tx_offer_.store(true, std::memory_order_release);
  } else if (c.kind == kCtlSwitch) {
    ok = rx_rgn_.on_switch(c, peer_tail_.load(std::memory_order_relaxed));
  } else if (c.kind == kCtlPressure) {
    rx_rgn_.on_pressure(c);  // a stale one is no error
  } else if (c.kind == kCtlBye) {
    peer_bye_.store(true, std::memory_order_release);
  } else {
    ok = false;
  }
  if (!ok) error_.store(-EPROTO, std::memory_order_relaxed);
}

void VerbsLink::on_completion(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS) {
    // A flushed or failed WR: the peer is gone, the path broke, or we
    // stopped the QP (abandon_unconfirmed).
    if (wc.wr_id & kSendWr) {
      std::lock_guard<std::mutex> lock(sq_mu_);
      note_send_completion(wc.wr_id, false);
    }
    error_.store(-ECONNRESET, std::memory_order_relaxed);
    return;
  }
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    uint32_t imm = ntohl(wc.imm_data);
    if (imm & kCreditBit) {
      peer_head_.store(widen(peer_head_.load(std::memory_order_relaxed), imm & ~kCreditBit), std::memory_order_release);
    } else {
      peer_tail_.store(widen(peer_tail_.load(std::memory_order_relaxed), imm), std::memory_order_release);
    }
    ++recv_consumed_;
    peer_seen_.store(true, std::memory_order_release);
  } else if (wc.opcode == IBV_WC_RECV) {
    // A control message (in QP order with the tails around it).
    Ctl c{};
    if (wc.byte_len != sizeof c || wc.wr_id >= kRecvDepth) {
      error_.store(-EPROTO, std::memory_order_relaxed);
    } else {
      memcpy(&c, static_cast<const char*>(ctl_.data) + wc.wr_id * sizeof c, sizeof c);
      on_control(c);
    }
    ++recv_consumed_;
    peer_seen_.store(true, std::memory_order_release);
  } else if (wc.opcode == IBV_WC_RDMA_WRITE || wc.opcode == IBV_WC_SEND) {
    std::lock_guard<std::mutex> lock(sq_mu_);
    // a signaled WR retires the batch it closed
    outstanding_.store(outstanding_.load(std::memory_order_relaxed) - static_cast<int>(wc.wr_id & 0xffff),
                       std::memory_order_relaxed);
    // ... and every data WRITE posted before it: staging up to there is free.
    uint64_t old = done_.load(std::memory_order_relaxed);
    uint64_t now = old + (((wc.wr_id >> 24) - old) & kPosMask);
    if (now - old <= ring_size_) done_.store(now, std::memory_order_release);
    note_send_completion(wc.wr_id, true);
  }
}

void VerbsLink::after_completions() {
  if (recv_consumed_ >= kRecvDepth / 4) {
    repost_receives(recv_consumed_);
    recv_consumed_ = 0;
  }
  // Completions made room: the credit that found none goes now (from any
  // thread that polls; a credit newer than the peer's is always valid).
  if (RDMASHIM_UNLIKELY(credit_owed_.load(std::memory_order_relaxed))) post_credit();
  // What the completions changed is stored; a sleeper counted itself before
  // it looked (prepare_sleep): one of the two sees the other.
  // (On a CQ of our own the CQ's event wakes our sleeper: no eventfd.)
  if (on_own_cq()) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_relaxed) > 0 && !rung_.exchange(true, std::memory_order_acq_rel)) {
    uint64_t one = 1;
    (void)sys::real().write(wake_fd_, &one, sizeof one);
  }
}

void VerbsLink::put(uint64_t offset, const void* src, size_t len) {
  // Into the staging buffer at the same offset modulo its size (it divides
  // the ring's): the application's buffer is read here, once, and never by
  // the provider later. The ring never puts more than put_room() said was
  // free, so nothing staged and not yet written is overwritten.
  const char* from = static_cast<const char*>(src);
  const size_t stage = stage_.load(std::memory_order_relaxed);
  while (len > 0) {
    uint64_t at = offset & (stage - 1);
    size_t chunk = len < stage - at ? len : static_cast<size_t>(stage - at);
    memcpy(static_cast<char*>(tx_.data) + at, from, chunk);
    offset += chunk;
    from += chunk;
    len -= chunk;
  }
}

size_t VerbsLink::put_room() {
  // A publish needs up to 3 WRs. A send queue the peer does not drain is
  // no room either: the writer waits for its completions as for credit.
  if (RDMASHIM_UNLIKELY(!sq_has_room(3 + kWriterReserve))) {
    poll_if_free();
    if (!sq_has_room(3 + kWriterReserve)) return 0;
  }
  // Asked before a write: everything put so far is published.
  uint64_t end = own_tail_.load(std::memory_order_relaxed);
  const size_t stage = stage_.load(std::memory_order_acquire);
  uint64_t used = end - done_.load(std::memory_order_acquire);
  if (used > stage / 2) {
    // Low: reap completions, and make sure one is coming that frees what
    // is staged (the writer then sleeps on the CQ like for credit).
    poll_if_free();
    used = end - done_.load(std::memory_order_acquire);
    if (used > stage / 2 && signaled_end_.load(std::memory_order_relaxed) < end) {
      post_writes(0, 0, false, 0, true);
    }
  }
  uint64_t room = used >= stage ? 0 : stage - used;
  if (RDMASHIM_UNLIKELY(tx_offer_.load(std::memory_order_acquire))) {
    // A bigger region is adopted at once: what a writer was told fits the
    // old one fits it too (a smaller one waits for maintain(), tx owned).
    std::unique_lock<std::mutex> lock(sq_mu_);
    if (tx_rgn_.offer_pending() && tx_rgn_.offered_size() >= tx_rgn_.size()) adopt_locked(lock);
  }
  uint64_t region = tx_rgn_.room(peer_head_.load(std::memory_order_acquire), end);
  if (RDMASHIM_UNLIKELY(region == 0) && !tx_pressured_.load(std::memory_order_relaxed)) {
    tx_pressured_.store(true, std::memory_order_relaxed);  // once per region: adopt_locked() clears it
    Ctl c{};
    std::unique_lock<std::mutex> lock(sq_mu_);
    if (reserve_sq(lock, 1) == 0 && tx_rgn_.take_pressure(&c)) post_ctl_locked(c);
  } else if (room == 0 && stage < ring_size_ && stage < kStageBytes) {
    stage_short_.store(true, std::memory_order_relaxed);  // publish_tail grows it
  }
  return static_cast<size_t>(room < region ? room : region);
}

int VerbsLink::reserve_sq(std::unique_lock<std::mutex>& lock, int n, Room room) {
  // Keep room in the send queue: reap completions when it runs low. A peer
  // that said Bye completes nothing more (post_locked posts nothing to it).
  while (!sq_has_room(n) && !peer_bye_.load(std::memory_order_acquire)) {
    if (room == Room::kNoWait) return -EAGAIN;
    lock.unlock();
    {
      std::lock_guard<std::mutex> cq(cq_->mu);
      poll_completions();
    }
    lock.lock();
    if (error()) return error();
    cpu_relax();
  }
  return 0;
}

int VerbsLink::post_writes(uint64_t from, uint64_t to, bool imm_last, uint32_t imm, bool signal, Room room,
                           int reserve) {
  std::unique_lock<std::mutex> lock(sq_mu_);
  if (int e = reserve_sq(lock, 3 + reserve, room)) return e;
  // At most two pieces: the range fits both the staging's free bytes and the
  // region's room, and the larger of the two wraps where the smaller does.
  ibv_send_wr wrs[3]{};
  ibv_sge sges[3]{};
  uint64_t ends[3]{};
  int count = 0;
  const size_t stage = stage_.load(std::memory_order_relaxed);
  const char* base = static_cast<const char*>(tx_.data);
  for (uint64_t pos = from; pos < to && count < 3; ++count) {
    uint64_t soff = pos & (stage - 1);
    uint64_t len = to - pos;
    if (len > stage - soff) len = stage - soff;
    if (len > tx_rgn_.contiguous(pos)) len = tx_rgn_.contiguous(pos);
    sges[count] = ibv_sge{reinterpret_cast<uintptr_t>(base + soff), static_cast<uint32_t>(len), tx_.mr->lkey};
    ibv_send_wr& wr = wrs[count];
    wr.sg_list = &sges[count];
    wr.num_sge = 1;
    wr.wr.rdma.remote_addr = tx_rgn_.addr_of(pos);
    if (len <= max_inline_) wr.send_flags |= IBV_SEND_INLINE;
    pos += len;
    ends[count] = pos;
  }
  if (count == 0) {
    wrs[0].num_sge = 0;  // a bare notification (credit, tail) or completion marker
    wrs[0].wr.rdma.remote_addr = tx_rgn_.base_addr();
    ends[0] = data_posted_end_;
    count = 1;
  } else if (ends[count - 1] != to) {
    error_.store(-EPROTO, std::memory_order_relaxed);  // cannot happen: the ring checked the room
    return -EPROTO;
  }
  for (int i = 0; i < count; ++i) {
    ibv_send_wr& wr = wrs[i];
    wr.wr.rdma.rkey = tx_rgn_.rkey();
    bool last = i == count - 1;
    wr.opcode = last && imm_last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (last && imm_last) wr.imm_data = htonl(imm);
    if (last && signal) wr.send_flags |= IBV_SEND_SIGNALED;
    wr.next = i + 1 < count ? &wrs[i + 1] : nullptr;
  }
  return post_locked(wrs, ends, count);
}

int VerbsLink::post_locked(ibv_send_wr* wrs, const uint64_t* ends, int count) {
  // Nothing to a QP that is gone: Soft-RoCE would retry it forever (retry_cnt
  // 7 means no limit there), each dead link sending every 67 ms.
  if (peer_bye_.load(std::memory_order_acquire)) return 0;
  for (int i = 0; i < count; ++i) {
    ibv_send_wr& wr = wrs[i];
    outstanding_.store(outstanding_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // Where its data starts (a control SEND or a bare notice has none).
    const bool data = wr.opcode != IBV_WR_SEND && wr.num_sge == 1;
    const uint64_t start = data ? ends[i] - wr.sg_list[0].length : ends[i];
    last_signaled_ = ++unsignaled_ >= kSignalEvery || (wr.send_flags & IBV_SEND_SIGNALED);
    if (last_signaled_) {
      // A signaled WR in the middle of a chain vouches only for the data up to itself.
      wr.send_flags |= IBV_SEND_SIGNALED;
      uint64_t vouched = ends[i] > data_posted_end_ ? ends[i] : data_posted_end_;
      wr.wr_id = tag_locked(vouched, start, static_cast<uint64_t>(unsignaled_));
      if (vouched > signaled_end_.load(std::memory_order_relaxed)) signaled_end_.store(vouched, std::memory_order_relaxed);
      unsignaled_ = 0;
    } else {
      wr.wr_id = tag_locked(0, start, 0);
    }
  }
  if (ends[count - 1] > data_posted_end_) data_posted_end_ = ends[count - 1];
  ++posts_;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, wrs, &bad) != 0) {
    error_.store(-EIO, std::memory_order_relaxed);
    return -EIO;
  }
  return 0;
}

uint64_t VerbsLink::tag_locked(uint64_t pos, uint64_t start, uint64_t count) {
  const uint8_t seq = wr_seq_++;
  wr_start_[seq] = start;
  return kSendWr | (pos & kPosMask) << 24 | uint64_t{seq} << 16 | count;
}

int VerbsLink::post_marker_locked(uint64_t target) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.num_sge = 0;
  wr.wr.rdma.remote_addr = tx_rgn_.base_addr();
  wr.wr.rdma.rkey = tx_rgn_.rkey();
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr_id = tag_locked(target, target, static_cast<uint64_t>(unsignaled_) + 1);
  unsignaled_ = 0;
  last_signaled_ = true;
  outstanding_.store(outstanding_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (ibv_post_send(qp_, &wr, &bad) != 0) {
    error_.store(-EIO, std::memory_order_relaxed);
    return -EIO;
  }
  signaled_end_.store(target, std::memory_order_relaxed);
  return 0;
}

void VerbsLink::note_send_completion(uint64_t wr_id, bool ok) {
  const uint8_t seq = static_cast<uint8_t>(wr_id >> 16);
  // Completions come in the order WRs were posted, and every WR before the
  // first that failed had completed: its data starts where the stream in
  // the peer's ring ends.
  if (!ok && wr_start_[seq] < first_lost_) first_lost_ = wr_start_[seq];
  reported_ = true;
  reported_seq_ = seq;
}

int VerbsLink::post_ctl_locked(const Ctl& c) {
  // From a send slot: one is reused only after kSendSlots further control
  // messages, when at most kSendDepth WRs can be outstanding (reserve_sq).
  char* slot = static_cast<char*>(ctl_.data) + (kRecvDepth + send_slot_++ % kSendSlots) * sizeof(Ctl);
  memcpy(slot, &c, sizeof c);
  ibv_sge sge{reinterpret_cast<uintptr_t>(slot), sizeof c, ctl_.mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (sizeof c <= max_inline_) wr.send_flags |= IBV_SEND_INLINE;
  uint64_t end = data_posted_end_;
  return post_locked(&wr, &end, 1);
}

int VerbsLink::post_ctl(const Ctl& c) {
  std::unique_lock<std::mutex> lock(sq_mu_);
  if (int e = reserve_sq(lock, 1)) return e;
  return post_ctl_locked(c);
}

int VerbsLink::flush(int timeout_ms, PeerWatch* watch) {
  if (!connected_) return 0;
  poll_if_free();  // a Bye already here?
  uint64_t target;  // the end of our data posted so far: what must land
  {
    std::lock_guard<std::mutex> lock(sq_mu_);
    if (error()) return error();
    // The peer closed for good: it reads nothing more, and its QP may be
    // gone, so nothing could confirm our writes (a TCP peer that closed
    // drops what arrives too).
    if (peer_bye_.load(std::memory_order_acquire)) return 0;
    // Only data WRITEs (and the tails they carry) matter: a credit or a
    // heartbeat still in flight need not be confirmed, and must not be
    // waited for: a peer that read all and closed never acknowledges it,
    // and Soft-RoCE retries retry_cnt 7 forever instead of failing.
    target = data_posted_end_;
    if (done_.load(std::memory_order_acquire) >= target) return 0;
    // Unsignaled WRs complete only with a later signaled one: post an empty,
    // signaled WRITE behind them; its completion retires them all. Once:
    // a flush looked at again (a close finishing in the background,
    // deferred_close.h) waits for the marker already on its way.
    if (signaled_end_.load(std::memory_order_relaxed) < target) {
      if (int e = post_marker_locked(target)) return e;
    }
  }
  // A peer gone without a Bye (SIGKILL, a crash) confirms nothing, and rxe
  // retries forever: the watch (our TCP side) is asked every millisecond
  // once a live peer's confirmation would have been here.
  constexpr uint64_t kWatchNs = 1'000'000;
  uint64_t now = now_ns();
  const uint64_t deadline = now + static_cast<uint64_t>(timeout_ms) * 1'000'000;
  uint64_t look = now + kWatchNs;
  for (;;) {
    {
      std::lock_guard<std::mutex> cq(cq_->mu);
      poll_completions();
    }
    if (done_.load(std::memory_order_acquire) >= target) return 0;
    if (error()) return error();
    if (peer_bye_.load(std::memory_order_acquire)) return 0;
    now = now_ns();
    if (watch && now >= look) {
      if (watch->gone()) {
        peer_bye_.store(true, std::memory_order_release);  // nothing more to post to it either
        return -ECONNRESET;
      }
      look = now + kWatchNs;
    }
    if (now >= deadline) {
      std::lock_guard<std::mutex> cq(cq_->mu);  // before sq_mu_, as poll_completions takes them
      std::lock_guard<std::mutex> lock(sq_mu_);
      RDMASHIM_DEBUG("verbs: data up to %llu posted, up to %llu confirmed; %d send WRs outstanding, %d receives to repost",
                     static_cast<unsigned long long>(target),
                     static_cast<unsigned long long>(done_.load(std::memory_order_relaxed)), outstanding_.load(),
                     recv_consumed_);
      return -ETIMEDOUT;
    }
    sched_yield();
  }
}

void VerbsLink::publish_tail(uint64_t tail) {
  // Everything put since the last publish is [old, tail) of the staging:
  // one WRITE, or two where it wraps; the last carries the tail.
  uint64_t old = own_tail_.load(std::memory_order_relaxed);
  own_tail_.store(tail, std::memory_order_relaxed);
  post_writes(old, tail, true, static_cast<uint32_t>(tail) & ~kCreditBit, false);
  // Everything put is posted: the staging may change under the writer.
  if (RDMASHIM_UNLIKELY(stage_short_.load(std::memory_order_relaxed) || old_tx_.mr)) maintain_staging(now_ns(), true);
}

uint64_t VerbsLink::peer_tail() {
  poll_if_free();
  return peer_tail_.load(std::memory_order_acquire);
}

uint64_t VerbsLink::peer_head() {
  poll_if_free();
  return peer_head_.load(std::memory_order_acquire);
}

void VerbsLink::publish_head(uint64_t head) {
  own_head_.store(head, std::memory_order_relaxed);
  // Batched: a quarter region, or everything the producer could have sent
  // when it may be waiting for room (all it wrote is consumed).
  const size_t region = rx_rgn_.size();
  bool drained = head == peer_tail_.load(std::memory_order_relaxed);
  if (head - credited_ >= region / 4 || (drained && head - credited_ >= region / 16) ||
      RDMASHIM_UNLIKELY(credit_owed_.load(std::memory_order_relaxed))) {
    credited_ = head;
    post_credit();
  }
  if (RDMASHIM_UNLIKELY(rx_rgn_.switched())) retire_rx();
  if (RDMASHIM_UNLIKELY(rx_rgn_.pressure())) {
    // The producer found our region full: a bigger one (rarely: x4 each time).
    std::lock_guard<std::mutex> lock(offer_mu_);
    if (rx_rgn_.can_offer() && rx_rgn_.pressure()) offer_region(rx_rgn_.grown_size(), true);
  }
}

void VerbsLink::announce() { post_write_with_imm(kCreditBit); }

int VerbsLink::post_credit(bool signal) {
  // Never waits for room: a reader must not spin in its recv() while a
  // peer that looks at nothing leaves our credits unacknowledged.
  // The head is read under credit_mu_: credits go out in the order of the
  // heads they carry (the peer widens each from the last; an older head
  // after a newer one would read as a jump of 2^31).
  std::lock_guard<std::mutex> lock(credit_mu_);
  credit_owed_.store(false, std::memory_order_relaxed);
  uint32_t imm = kCreditBit | (static_cast<uint32_t>(own_head_.load(std::memory_order_relaxed)) & ~kCreditBit);
  int r = post_writes(0, 0, true, imm, signal, Room::kNoWait, kCreditReserve);
  if (r == -EAGAIN) credit_owed_.store(true, std::memory_order_relaxed);
  return r;
}


bool VerbsLink::peer_seen() const {
  auto* self = const_cast<VerbsLink*>(this);
  if (!peer_seen_.load(std::memory_order_acquire)) self->poll_if_free();
  return peer_seen_.load(std::memory_order_acquire);
}

void VerbsLink::prepare_sleep(unsigned) {
  sleeping_.fetch_add(1, std::memory_order_seq_cst);
  cq_->sleep_begins();  // counted there too, then armed: the caller's look comes after
  if (on_own_cq()) {
    // Only a completion after the arm makes our CQ's event, and nothing
    // else rings us: one another thread (the heartbeat's tending, another
    // of the program's) polled before the arm and is handing over now must
    // be stored before the caller looks, which never waits for the mutex.
    std::lock_guard<std::mutex> lock(cq_->mu);
    poll_completions();
  }
}

void VerbsLink::finish_sleep(unsigned, bool rung) {
  cq_->sleep_ends();
  if (on_own_cq()) {  // its channel is the doorbell
    sleeping_.fetch_sub(1, std::memory_order_relaxed);
    cq_->take_own_events();
    return;
  }
  // The last sleeper out drains the doorbell; earlier ones leave it
  // readable, so a thread still about to sleep cannot miss its wakeup.
  if (sleeping_.fetch_sub(1, std::memory_order_seq_cst) != 1) return;
  if (rung_.exchange(false, std::memory_order_acq_rel) || rung) {
    uint64_t count;
    (void)sys::real().read(wake_fd_, &count, sizeof count);
  }
}

}  // namespace rdmashim::verbs
