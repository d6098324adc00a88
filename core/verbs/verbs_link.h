// Link over an RDMA RC queue pair.
//
//   data:    put() copies into a registered staging buffer (at most 1 MiB,
//            not a whole mirror of the peer's ring: only the peer's rx ring
//            is pinned at full size); publish_tail() posts RDMA WRITEs of
//            what was put since the last publish to the same offsets of the
//            peer's ring (two where it wraps; inline when small), the last
//            carrying the new tail as immediate data (WRITE WITH IMM). The
//            peer learns the tail from that completion, which the verbs
//            specification orders after the placement of every earlier
//            WRITE: nothing relies on the order in which bytes land. Staged
//            bytes are free again once their WRITE completed (a signaled
//            WR's wr_id carries the position posted so far); put_room()
//            caps the ring's room by the free staging, so a writer waits for
//            completions where it waits for credit (asleep on the CQ, its
//            TCP side watched), never inside a write.
//   credits: the consumer returns its head the same way (immediate data with
//            the top bit set), batched: once a quarter ring was consumed
//            since the last credit, never one per message.
//   waiting: completions arrive on a CQ of the link's own or one shared
//            with other links of the process (verbs/shared_cq.h). On its
//            own CQ the doorbell is the CQ's channel; on a shared one, the
//            link's eventfd, rung by whoever hands it a completion while a
//            thread sleeps on it. prepare_sleep() counts the sleeper and
//            arms the CQ, the caller re-checks, then sleeps on the doorbell.
//            A reader away from its socket polls nothing: the heartbeat
//            thread tends its CQ (SharedCq::tend), so its receives are
//            reposted and the writer's messages keep landing in its ring.
//   memory:  the receive ring is a chain of registered regions
//            (verbs/regions.h): kStartRegion at first, grown when the
//            producer reports pressure (in the reader's calls, or by the
//            heartbeat thread while it is away), shrunk when drained and
//            idle; the
//            Pressure/Offer/Switch messages are SENDs into receive slots of
//            a small registered control buffer. The staging buffer likewise
//            starts at kStartRegion, grows while a writer waits on it and
//            shrinks when idle (maintain()).
// Immediate data carries positions modulo 2^31, widened again on receipt
// (a ring is at most kMaxRingSize, so no update can be 2^30 ahead: asserted
// below, with the Params frame's u32 ring size).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "link/link.h"
#include "ring/ring_limits.h"
#include "util/misc.h"
#include "verbs/device.h"
#include "verbs/params.h"
#include "verbs/regions.h"
#include "verbs/shared_cq.h"
#include "wire/wire.h"

namespace rdmashim::verbs {

void* heartbeat_loop(void*);

static_assert(kMaxRingSize < (uint64_t{1} << 30), "positions travel modulo 2^31 in immediate data");
static_assert(kMaxRingSize <= UINT32_MAX, "Params carries the ring size in a u32");
static_assert(sizeof(Params) == wire::kParamsBytes && offsetof(Params, addr) == 24 && offsetof(Params, lid) == 40);

struct Leftovers;  // verbs_link_setup.cc

class VerbsLink final : public Link {
 public:
  // Creates the QP (in INIT), registers the first region of the rx ring and
  // of the staging (kStartRegion at most; local_params() offers ring_size as
  // the ring) and posts the receives. Under the watchdog
  // (util/watchdog.h): a provider that does not answer within the setup
  // timeout gives -ETIMEDOUT, and this process stops using verbs. A process
  // at its verbs limits (verbs/limits.h) gets -EDQUOT, *limit saying which.
  static std::unique_ptr<VerbsLink> create(Device& dev, size_t ring_size, const sockaddr* local, int* err,
                                           const char** limit = nullptr);
  ~VerbsLink() override;

  const Params& local_params() const { return local_; }
  // Moves the QP to RTR and RTS towards the peer. Once, never retried.
  // The peer's Params are checked first (params_plausible); `ring`, the
  // size both directions use from now on, must fit what each side
  // registered (ours, and the peer's ring_size). -EPROTO otherwise. The
  // transitions run under the watchdog, as create() does (-ETIMEDOUT).
  int connect(const Params& peer, size_t ring);
  // After connect(): tells the peer we can take writes (a bare credit).
  void announce();
  // A write from the peer arrived (so its QP is connected to ours).
  bool peer_seen() const;
  // Tells a peer that understands it (kParamsBye) that our QP is going away:
  // its close then waits for nothing more from us. Once; never waits.
  void say_bye();
  // In a forked child: the parent's links and heartbeat thread are not ours.
  static void forget_after_fork();

  size_t ring_size() const override { return ring_size_; }
  void put(uint64_t offset, const void* src, size_t len) override;
  void publish_tail(uint64_t tail) override;
  uint64_t peer_head() override;
  const unsigned char* rx_data() const override {
    size_t n;
    return rx_rgn_.at(own_head(), &n);
  }
  const unsigned char* rx_span(uint64_t pos, size_t* contiguous) const override { return rx_rgn_.at(pos, contiguous); }
  uint64_t peer_tail() override;
  void publish_head(uint64_t head) override;
  uint64_t own_tail() const override { return own_tail_.load(std::memory_order_relaxed); }
  uint64_t own_head() const override { return own_head_.load(std::memory_order_relaxed); }
  int wait_fd() const override { return doorbell_; }
  void prepare_sleep(unsigned what) override;
  void finish_sleep(unsigned what, bool rung) override;
  int error() const override { return error_.load(std::memory_order_relaxed); }
  int flush(int timeout_ms, PeerWatch* watch = nullptr) override;
  bool flush_lingers() const override { return true; }
  void peer_lost() override { peer_bye_.store(true, std::memory_order_release); }
  void set_exit_notice(ExitNotice n) override;  // under g_links_mu: the exit flush reads it
  int abandon_unconfirmed(uint64_t* confirmed, int timeout_ms) override;
  const unsigned char* staged(uint64_t pos, size_t* contiguous) const override;
  // g_links_mu held, at exit: our writes stay unconfirmed (ExitNotice).
  void exit_unconfirmed() const {
    if (exit_notice_.cut) exit_notice_.cut(exit_notice_.ctx);
  }
  bool provider_on_our_cores() const override { return dev_.software(); }
  size_t put_room() override;
  bool maintained() const override { return true; }
  bool maintenance_wanted() const override {
    const size_t small = ring_size_ < kStartRegion ? ring_size_ : kStartRegion;
    return tx_offer_.load(std::memory_order_relaxed) || rx_rgn_.pressure() || rx_rgn_.switched() ||
           rx_rgn_.size_hint() > small || stage_.load(std::memory_order_relaxed) > small ||
           stage_short_.load(std::memory_order_relaxed);
  }
  uint64_t maintain(uint64_t now, bool tx_owned, bool rx_owned) override;
  // What is registered for this link's rings now (rx regions and staging).
  size_t rx_region_size() const { return rx_rgn_.size(); }

  static constexpr size_t kStageBytes = size_t{1} << 20;  // the most a send side registers for staging

 private:
  static constexpr int kSendDepth = 256;
  static constexpr int kRecvDepth = 256;
  static constexpr int kSignalEvery = 64;
  // Send-queue slots writes leave free: for credits (kCreditReserve of them
  // also left by credits) and control messages. A peer whose receive queue
  // ran dry (its program looks at nothing; RNR retries have no limit)
  // acknowledges nothing, and a writer must then wait as for credit, not
  // spin: a non-blocking send returns EAGAIN as TCP's would.
  static constexpr int kWriterReserve = 16;
  static constexpr int kCreditReserve = 4;
  static constexpr uint32_t kCreditBit = 1u << 31;
  // A send WR's wr_id (a receive's is its slot, below kRecvDepth):
  //   bit 63      kSendWr
  //   bits 24-62  a position (kPosMask): a signaled WR's, what it vouches for
  //   bits 16-23  the WR's sequence number (mod kSendDepth): wr_start_
  //   bits 0-15   how many WRs a signaled one retires (0: unsignaled)
  static constexpr uint64_t kSendWr = uint64_t{1} << 63;
  static constexpr uint64_t kPosMask = (uint64_t{1} << 39) - 1;
  static_assert(kSendDepth == 256, "a WR's sequence number is 8 bits");
  static constexpr int kSendSlots = kSendDepth;  // a slot is reused only after its WR completed
  static constexpr size_t kCtlBytes = (kRecvDepth + kSendSlots) * sizeof(Ctl);
  static constexpr uint64_t kIdleNs = 1'000'000'000;  // drained this long: shrink
  struct Piece {
    uint64_t raddr;
    const void* src;
    uint32_t len;
  };

  static_assert(SharedCq::kCqesPerLink >= kSendDepth + kRecvDepth, "a link never overflows its shared CQ");

  explicit VerbsLink(Device& dev) : dev_(dev) {}
  friend class SharedCq;
  // Polling the shared CQ: what it holds for any of its links goes to them.
  void poll_completions() { cq_->poll_locked(); }  // caller holds cq_->mu
  void poll_if_free() {  // unless another thread polls it now (that one hands us ours)
    if (cq_->mu.try_lock()) {
      cq_->poll_locked();
      cq_->mu.unlock();
    }
  }
  // From SharedCq::poll_locked (cq_->mu held): one of our completions;
  // then, once per batch, receives reposted and a sleeper woken.
  void on_completion(const ibv_wc& wc);
  void after_completions();
  void cq_failed() { error_.store(-EIO, std::memory_order_relaxed); }
  void on_control(const Ctl& c);  // a SEND from the peer; cq_->mu held
  // Waits (polling) until the send queue has room for n more WRs; returns
  // with sq_mu_ held by `lock`, or the link's error. kNoWait: -EAGAIN at
  // once instead (a queue that stays full is a peer that acknowledges
  // nothing; the heartbeat holds every link's lock and must not wait on it).
  enum class Room : bool { kWait, kNoWait };
  int reserve_sq(std::unique_lock<std::mutex>& lock, int n, Room room = Room::kWait);
  bool sq_has_room(int n) const {  // lock-free: a hint, reserve_sq decides
    return outstanding_.load(std::memory_order_relaxed) + n + 1 <= kSendDepth - 4;
  }
  // Posts a credit for own_head() (signaled if signal: the heartbeat's)
  // unless the send queue is short of room; then one is owed, and the next
  // completions (or publish) post it. 0, -EAGAIN or the link's error.
  int post_credit(bool signal = false);
  // Posts staged positions [from, to) as RDMA WRITEs into the peer's current
  // region (from == to: one bare WRITE), the last WITH IMM if imm_last,
  // signaled if signal (else every kSignalEvery-th). A signaled WR's wr_id
  // carries the data posted so far, so its completion tells how far staging
  // is free.
  // room kNoWait: -EAGAIN if the queue lacks room for 3 + reserve WRs.
  int post_writes(uint64_t from, uint64_t to, bool imm_last, uint32_t imm, bool signal, Room room = Room::kWait,
                  int reserve = 0);
  int post_write_with_imm(uint32_t imm) { return post_writes(0, 0, true, imm, false); }
  int post_locked(ibv_send_wr* wrs, const uint64_t* ends, int count);  // sq_mu_ held, room reserved
  // sq_mu_ held: the wr_id of the next WR posted (its data starts at `start`).
  uint64_t tag_locked(uint64_t pos, uint64_t start, uint64_t count);
  // sq_mu_ held: an empty signaled WRITE vouching for `target`; its
  // completion retires every unsignaled WR before it.
  int post_marker_locked(uint64_t target);
  // cq_->mu and sq_mu_ held: a send WR's completion (or its flush).
  void note_send_completion(uint64_t wr_id, bool ok);
  int post_ctl_locked(const Ctl& c);              // sq_mu_ held, room reserved
  int post_ctl(const Ctl& c);
  // Producer, sq_mu_ held: switches to the offered region at the end of
  // what was posted.
  void adopt_locked(std::unique_lock<std::mutex>& lock);
  // Consumer, offer_mu_ held: registers a region of `size` (else of
  // `fallback`, if smaller and not 0) and offers it.
  // budgeted: a larger region (a shrink replaces a larger one, so it may not be refused for memory).
  // room kNoWait: no offer (the buffer dropped, the pressure kept) when
  // the send queue has no room for it now.
  void offer_region(size_t size, bool budgeted, Room room = Room::kWait, size_t fallback = 0);
  // The heartbeat thread: offer_region for a pressure our program is away
  // from (away: nobody polled our CQ since the last look).
  void tend_regions(bool away);
  void retire_rx();  // reader: gives back the region the stream left
  // Tx owned, everything put posted: grows a staging writers found full
  // (grow_only: only that), shrinks an idle one, gives back the previous one.
  uint64_t maintain_staging(uint64_t now, bool grow_only);

  void repost_receives(int n);
  static uint64_t widen(uint64_t old, uint32_t low31);
  static std::unique_ptr<VerbsLink> create_now(Device& dev, size_t ring_size, const sockaddr* local, int* err,
                                               Refusal* why);
  // A transition the watchdog gave up on: the thread still in the provider
  // gets our QP, CQ, channel and rings, and releases them if it returns.
  void hand_over_resources(Leftovers* to);

  Device& dev_;
  size_t ring_size_ = 0;
  RxRegions rx_rgn_;    // our rx ring's regions
  TxRegions tx_rgn_;    // the peer's, under sq_mu_ (room(): any thread)
  Buffer first_rx_{};   // the first region until connect() hands it to rx_rgn_
  Buffer tx_{};         // the staging buffer of our writes
  Buffer old_tx_{};     // the previous one, until the writes from it completed
  uint64_t old_tx_until_ = 0;
  size_t old_stage_ = 0;  // the staging size old_tx_ was used with
  Buffer ctl_{};        // receive slots, then send slots, of control messages
  uint32_t recv_slot_ = 0, send_slot_ = 0;
  std::atomic<size_t> stage_{0};  // staging bytes used: a power of two dividing the ring
  std::atomic<bool> tx_offer_{false};      // an offer waits for adoption
  std::atomic<bool> stage_short_{false};   // a writer found the staging full
  std::atomic<bool> tx_pressured_{false};  // we reported pressure on the peer's current region
  std::mutex offer_mu_;                    // the consumer's offers and retirement
  uint64_t idle_tail_ = 0, idle_since_ = 0;    // offer_mu_: the last tail maintain() saw, since when
  uint64_t idle_posted_ = 0, tx_idle_since_ = 0;  // tx owned: the same for our writes

  SharedCq* cq_ = nullptr;  // attached once; cq_->mu guards what completions update
  // A CQ of our own: its channel is our doorbell (no eventfd, no watcher).
  bool on_own_cq() const { return wake_fd_ < 0; }
  int wake_fd_ = -1;        // on a shared CQ: our eventfd, ours to close
  int doorbell_ = -1;       // wake_fd_, or our own CQ's channel
  std::atomic<int> sleeping_{0};    // threads between prepare_sleep and finish_sleep
  ExitNotice exit_notice_;          // g_links_mu
  std::atomic<bool> rung_{false};   // the doorbell was rung since the last drain
  ibv_qp* qp_ = nullptr;
  uint32_t qpn_ = 0;        // qp_'s number, for the CQ's table (qp_ may be handed over)
  uint32_t max_inline_ = 0;
  Params local_{};
  Params peer_{};
  bool connected_ = false;

  std::atomic<uint64_t> peer_tail_{0}, peer_head_{0};
  std::atomic<uint64_t> own_tail_{0}, own_head_{0};
  uint64_t credited_ = 0;  // head we last told the peer
  std::atomic<uint64_t> done_{0};  // every data WRITE before this completed
  uint64_t data_posted_end_ = 0;   // under sq_mu_
  std::atomic<uint64_t> signaled_end_{0};  // the most a posted signaled WR vouches for
  std::mutex sq_mu_;       // the send queue
  int unsignaled_ = 0;
  bool last_signaled_ = true;        // the last WR posted was (under sq_mu_)
  uint8_t wr_seq_ = 0;               // the next WR's sequence number (under sq_mu_)
  uint64_t wr_start_[kSendDepth]{};  // by sequence number: where each WR's data starts (sq_mu_)
  // abandon_unconfirmed: the QP stops; the first WR it flushed says where
  // the peer's ring ends, once the last WR posted reported (succeeded or
  // flushed). Under sq_mu_.
  bool reported_ = false;             // a send WR's completion came
  uint8_t reported_seq_ = 0;          // the latest one's sequence number
  uint64_t first_lost_ = UINT64_MAX;  // where the first flushed WR's data starts
  std::atomic<bool> qp_stuck_{false};        // a provider thread never came back with our QP
  std::atomic<int> outstanding_{0};  // send WRs not yet known complete; written under sq_mu_
  std::atomic<bool> credit_owed_{false};  // a credit found no room in the send queue
  // Every credit (post_credit) reads own_head_ and posts under it.
  // Order: g_links_mu or cq_->mu, then credit_mu_, then sq_mu_.
  std::mutex credit_mu_;
  int recv_consumed_ = 0;
  std::atomic<int> error_{0};
  std::atomic<bool> peer_seen_{false};
  // The peer said Bye, or was found gone (a flush's watch, peer_lost()): its QP is gone or
  // going, so nothing is posted to it any more (Soft-RoCE would retry it
  // forever) and a flush waits for nothing.
  std::atomic<bool> peer_bye_{false};
  bool said_bye_ = false;  // under sq_mu_
  unsigned fork_generation_ = 0;  // g_fork_generation when made (verbs_link_setup.cc)
  // Idle heartbeat: some providers degrade QPs that stay idle for tens of
  // minutes, so a link with no post for a minute re-sends its last credit.
  friend void* heartbeat_loop(void*);
  void heartbeat_if_idle();
  // The same thread, every few milliseconds: our CQ, if nobody polled it
  // since its last look (SharedCq::tend). true if it held completions.
  // Then a pressure the writer reported: the bigger region (tend_regions).
  bool tend() {
    if (!cq_) return false;
    bool unwatched = false;
    bool handed = cq_->tend(&unwatched);
    if (RDMASHIM_UNLIKELY(rx_rgn_.pressure())) tend_regions(unwatched);
    return handed;
  }
  uint64_t posts_ = 0;            // under sq_mu_
  uint64_t posts_at_beat_ = 0;    // the heartbeat thread's last look
  bool beat_pending_ = false;     // the heartbeat thread's last beat, not known complete
};

}  // namespace rdmashim::verbs
