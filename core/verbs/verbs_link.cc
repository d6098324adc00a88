// VerbsLink's data path: put and publish (RDMA WRITE WITH IMM), credits,
// polling the completion queue, flushing, sleeping on the completion
// channel, and the idle heartbeat's credit. Setup is in verbs_link_setup.cc.
#include "verbs/verbs_link.h"

#include <arpa/inet.h>
#include <sched.h>

#include <cerrno>
#include <cstring>

#include "util/log.h"
#include "util/misc.h"
#include "verbs/ibv_api.h"

namespace rdmashim::verbs {

void VerbsLink::heartbeat_if_idle() {
  uint64_t posts;
  {
    std::lock_guard<std::mutex> lock(sq_mu_);
    posts = posts_;
  }
  if (posts == posts_at_beat_ && !error()) {
    // Our consumed position again: a valid credit the peer already has, or newer.
    post_write_with_imm(nullptr, 0, kCreditBit | (static_cast<uint32_t>(own_head()) & ~kCreditBit));
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
  // Zero-length receives: WRITE WITH IMM consumes one and places no bytes.
  for (int i = 0; i < n; ++i) {
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 0;
    wr.num_sge = 0;
    if (ibv_post_recv(qp_, &wr, &bad) != 0) {
      error_.store(-EIO, std::memory_order_relaxed);
      return;
    }
  }
}

void VerbsLink::poll_completions() {
  ibv_wc wc[32];
  for (;;) {
    int n = ibv_poll_cq(cq_, 32, wc);
    if (n <= 0) {
      if (n < 0) error_.store(-EIO, std::memory_order_relaxed);
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        // A flushed or failed WR: the peer is gone or the path broke.
        error_.store(-ECONNRESET, std::memory_order_relaxed);
        continue;
      }
      if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        uint32_t imm = ntohl(wc[i].imm_data);
        if (imm & kCreditBit) {
          peer_head_.store(widen(peer_head_.load(std::memory_order_relaxed), imm & ~kCreditBit),
                           std::memory_order_release);
        } else {
          peer_tail_.store(widen(peer_tail_.load(std::memory_order_relaxed), imm), std::memory_order_release);
        }
        ++recv_consumed_;
        peer_seen_.store(true, std::memory_order_release);
      } else if (wc[i].opcode == IBV_WC_RDMA_WRITE) {
        std::lock_guard<std::mutex> lock(sq_mu_);
        outstanding_ -= static_cast<int>(wc[i].wr_id & 0xffff);  // a signaled WR retires the batch it closed
        // ... and every data WRITE posted before it: staging up to there is free.
        uint64_t old = done_.load(std::memory_order_relaxed);
        uint64_t now = old + (((wc[i].wr_id >> 16) - old) & kPosMask);
        if (now - old <= stage_) done_.store(now, std::memory_order_release);
      }
    }
  }
  if (recv_consumed_ >= kRecvDepth / 4) {
    repost_receives(recv_consumed_);
    recv_consumed_ = 0;
  }
}

void VerbsLink::put(uint64_t offset, const void* src, size_t len) {
  // Into the staging buffer at the same offset modulo its size (it divides
  // the ring's): the application's buffer is read here, once, and never by
  // the provider later. The ring never puts more than put_room() said was
  // free, so nothing staged and not yet written is overwritten.
  const char* from = static_cast<const char*>(src);
  while (len > 0) {
    uint64_t at = offset & (stage_ - 1);
    size_t chunk = len < stage_ - at ? len : static_cast<size_t>(stage_ - at);
    memcpy(static_cast<char*>(tx_.data) + at, from, chunk);
    offset += chunk;
    from += chunk;
    len -= chunk;
  }
}

size_t VerbsLink::put_room() {
  // Asked before a write: everything put so far is published.
  uint64_t end = own_tail_.load(std::memory_order_relaxed);
  uint64_t used = end - done_.load(std::memory_order_acquire);
  if (used > stage_ / 2) {
    // Low: reap completions, and make sure one is coming that frees what
    // is staged (the writer then sleeps on the CQ like for credit).
    if (cq_mu_.try_lock()) {
      poll_completions();
      cq_mu_.unlock();
    }
    used = end - done_.load(std::memory_order_acquire);
    if (used > stage_ / 2 && signaled_end_.load(std::memory_order_relaxed) < end) {
      post_writes(nullptr, 0, false, 0, true, 0);
    }
  }
  return used >= stage_ ? 0 : static_cast<size_t>(stage_ - used);
}

int VerbsLink::post_range(uint64_t from, uint64_t to, bool imm_last, uint32_t imm, bool signal) {
  // At most two pieces: the ring wraps where the staging does (stage_ divides it).
  const char* base = static_cast<const char*>(tx_.data);
  uint64_t off = from & (ring_size_ - 1), soff = from & (stage_ - 1);
  uint64_t len = to - from;
  uint64_t first = stage_ - soff < len ? stage_ - soff : len;
  Piece pieces[2] = {{off, base + soff, static_cast<uint32_t>(first)},
                     {(off + first) & (ring_size_ - 1), base, static_cast<uint32_t>(len - first)}};
  return post_writes(pieces, len > first ? 2 : 1, imm_last, imm, signal, to);
}

int VerbsLink::post_writes(const Piece* pieces, int n, bool imm_last, uint32_t imm, bool signal, uint64_t data_end) {
  std::unique_lock<std::mutex> lock(sq_mu_);
  // Keep room in the send queue: reap completions when it runs low.
  while (outstanding_ + n + 1 > kSendDepth - 4) {
    lock.unlock();
    {
      std::lock_guard<std::mutex> cq(cq_mu_);
      poll_completions();
    }
    if (error()) return error();
    cpu_relax();
    lock.lock();
  }
  // Where each WR's data ends: a signaled WR in the middle of the chain
  // vouches only for the pieces up to itself.
  uint64_t end = data_posted_end_;
  if (data_end) {
    end = data_end;
    for (int i = 0; i < n; ++i) end -= pieces[i].len;
  }
  ibv_send_wr wrs[3]{};
  ibv_sge sges[3]{};
  int count = n > 0 ? n : 1;
  for (int i = 0; i < count; ++i) {
    ibv_send_wr& wr = wrs[i];
    if (n > 0) {
      sges[i].addr = reinterpret_cast<uintptr_t>(pieces[i].src);
      sges[i].length = pieces[i].len;
      sges[i].lkey = tx_.mr->lkey;
      wr.sg_list = &sges[i];
      wr.num_sge = 1;
      wr.wr.rdma.remote_addr = peer_.addr + pieces[i].offset;
      if (data_end) end += pieces[i].len;
      if (pieces[i].len <= max_inline_) wr.send_flags |= IBV_SEND_INLINE;
    } else {
      wr.num_sge = 0;  // a bare notification (credit, tail) or completion marker
      wr.wr.rdma.remote_addr = peer_.addr;
    }
    wr.wr.rdma.rkey = peer_.rkey;
    bool last = i == count - 1;
    wr.opcode = last && imm_last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (last && imm_last) wr.imm_data = htonl(imm);
    wr.next = i + 1 < count ? &wrs[i + 1] : nullptr;
    ++outstanding_;
    if (++unsignaled_ >= kSignalEvery || (last && signal)) {
      wr.send_flags |= IBV_SEND_SIGNALED;
      uint64_t vouched = end > data_posted_end_ ? end : data_posted_end_;
      wr.wr_id = (vouched & kPosMask) << 16 | static_cast<uint64_t>(unsignaled_);
      if (vouched > signaled_end_.load(std::memory_order_relaxed)) signaled_end_.store(vouched, std::memory_order_relaxed);
      unsignaled_ = 0;
    }
  }
  if (data_end > data_posted_end_) data_posted_end_ = data_end;
  ++posts_;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, wrs, &bad) != 0) {
    error_.store(-EIO, std::memory_order_relaxed);
    return -EIO;
  }
  return 0;
}

int VerbsLink::flush(int timeout_ms) {
  if (!connected_) return 0;
  uint64_t target;  // the end of our data posted so far: what must land
  {
    std::lock_guard<std::mutex> lock(sq_mu_);
    if (error()) return error();
    // Only data WRITEs (and the tails they carry) matter: a credit or a
    // heartbeat still in flight need not be confirmed, and must not be
    // waited for: a peer that read all and closed never acknowledges it,
    // and Soft-RoCE retries retry_cnt 7 forever instead of failing.
    target = data_posted_end_;
    if (done_.load(std::memory_order_acquire) >= target) return 0;
    // Unsignaled WRs complete only with a later signaled one: post an empty,
    // signaled WRITE behind them; its completion retires them all.
    ibv_send_wr wr{}, *bad = nullptr;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.num_sge = 0;
    wr.wr.rdma.remote_addr = peer_.addr;
    wr.wr.rdma.rkey = peer_.rkey;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr_id = (target & kPosMask) << 16 | (static_cast<uint64_t>(unsignaled_) + 1);
    unsignaled_ = 0;
    ++outstanding_;
    if (ibv_post_send(qp_, &wr, &bad) != 0) {
      error_.store(-EIO, std::memory_order_relaxed);
      return -EIO;
    }
  }
  uint64_t deadline = now_ns() + static_cast<uint64_t>(timeout_ms) * 1'000'000;
  for (;;) {
    {
      std::lock_guard<std::mutex> cq(cq_mu_);
      poll_completions();
    }
    if (done_.load(std::memory_order_acquire) >= target) return 0;
    if (error()) return error();
    if (now_ns() >= deadline) {
      std::lock_guard<std::mutex> cq(cq_mu_);  // before sq_mu_, as poll_completions takes them
      std::lock_guard<std::mutex> lock(sq_mu_);
      RDMASHIM_DEBUG("verbs: data up to %llu posted, up to %llu confirmed; %d send WRs outstanding, %d receives to repost",
                     static_cast<unsigned long long>(target),
                     static_cast<unsigned long long>(done_.load(std::memory_order_relaxed)), outstanding_,
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
  post_range(old, tail, true, static_cast<uint32_t>(tail) & ~kCreditBit, false);
}

uint64_t VerbsLink::peer_tail() {
  if (cq_mu_.try_lock()) {
    poll_completions();
    cq_mu_.unlock();
  }
  return peer_tail_.load(std::memory_order_acquire);
}

uint64_t VerbsLink::peer_head() {
  if (cq_mu_.try_lock()) {
    poll_completions();
    cq_mu_.unlock();
  }
  return peer_head_.load(std::memory_order_acquire);
}

void VerbsLink::publish_head(uint64_t head) {
  own_head_.store(head, std::memory_order_relaxed);
  // Batched: a quarter ring, or everything the producer could have sent
  // when it may be waiting for room (all it wrote is consumed).
  bool drained = head == peer_tail_.load(std::memory_order_relaxed);
  if (head - credited_ >= ring_size_ / 4 || (drained && head - credited_ >= ring_size_ / 16)) {
    credited_ = head;
    post_write_with_imm(nullptr, 0, kCreditBit | (static_cast<uint32_t>(head) & ~kCreditBit));
  }
}

void VerbsLink::announce() { post_write_with_imm(nullptr, 0, kCreditBit); }

bool VerbsLink::peer_seen() const {
  auto* self = const_cast<VerbsLink*>(this);
  if (!peer_seen_.load(std::memory_order_acquire) && self->cq_mu_.try_lock()) {
    self->poll_completions();
    self->cq_mu_.unlock();
  }
  return peer_seen_.load(std::memory_order_acquire);
}

void VerbsLink::prepare_sleep(unsigned) { ibv_req_notify_cq(cq_, 0); }

void VerbsLink::finish_sleep(unsigned, bool) {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (ibv()->get_cq_event(channel_, &cq, &ctx) == 0) ++events_unacked_;
  if (events_unacked_ >= 64) {
    ibv()->ack_cq_events(cq_, events_unacked_);
    events_unacked_ = 0;
  }
}

}  // namespace rdmashim::verbs
