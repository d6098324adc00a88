// VerbsLink setup: creating the QP (on a shared CQ), its doorbell and
// registered rings, the Params the peer needs, the transitions to RTR and RTS, and the
// process's list of connected links (the idle heartbeat thread, the flush at
// exit, forgetting them after fork). The data path is in verbs_link.cc.
#include "verbs/verbs_link.h"

#include <netinet/in.h>

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "util/fault.h"
#include "util/config.h"
#include "util/fd_budget.h"
#include "util/misc.h"
#include "util/thread.h"
#include "util/watchdog.h"
#include "verbs/ibv_api.h"

namespace rdmashim::verbs {
namespace {

std::mutex g_links_mu;
// Connected links of this process. Never destroyed: the heartbeat thread
// runs until the process is gone, after the library's static destructors.
std::vector<VerbsLink*>& g_links = *new std::vector<VerbsLink*>();
bool g_exiting = false;  // g_links_mu: the exit flush took the links over
bool g_heartbeat_started = false;
unsigned g_fork_generation = 0;  // a link made before a fork is the parent's

void start_heartbeat_locked() {
  if (!g_heartbeat_started) g_heartbeat_started = start_background_thread(heartbeat_loop, nullptr);
}

}  // namespace

// A link's resources, handed to the thread a timed-out transition left in
// the provider (VerbsLink::connect): it releases them when (if) it returns.
// Whichever comes second, the hand-over or the return, decides: a link whose
// call returned before it could hand over keeps and destroys its own.
struct Leftovers {
  std::mutex mu;
  bool returned = false;
  Device* dev = nullptr;
  ibv_qp* qp = nullptr;
  SharedCq* cq = nullptr;  // the QP's: its room is freed once the QP is gone
  Buffer rx{}, tx{}, ctl{};

  void release() {
    Leftovers mine;
    {
      std::lock_guard<std::mutex> lock(mu);
      returned = true;
      mine.dev = dev, mine.qp = qp, mine.cq = cq, mine.rx = rx, mine.tx = tx, mine.ctl = ctl;
    }
    if (!mine.dev) return;  // nothing was handed over
    mine.dev->destroy_qp(mine.qp);
    if (mine.cq) mine.cq->detach(0);  // a shared CQ is destroyed only with no QP on it
    mine.dev->give_back(mine.rx), mine.dev->give_back(mine.tx), mine.dev->give_back(mine.ctl);
  }
};

void VerbsLink::hand_over_resources(Leftovers* to) {
  std::lock_guard<std::mutex> lock(to->mu);
  if (to->returned) return;
  // Only before connected_: the rx ring is still first_rx_ (no region offered yet).
  // The CQ too: while the QP lives it may still complete there, so it
  // stays attached (never destroyed under the QP), but nothing reaches us.
  if (cq_) cq_->remove(qpn_);
  to->dev = &dev_, to->qp = qp_, to->cq = cq_;
  to->rx = first_rx_, to->tx = tx_, to->ctl = ctl_;
  qp_ = nullptr, cq_ = nullptr, first_rx_ = Buffer{}, tx_ = Buffer{}, ctl_ = Buffer{};
}

void* heartbeat_loop(void*) {
  // Tends every link's CQ (SharedCq::tend): every kTendMinMs while a look
  // finds completions (a writer sending to a reader away from its socket),
  // backing off to kTendMaxMs while none does; and beats idle links every
  // heartbeat_s.
  constexpr long kTendMinMs = 5, kTendMaxMs = 250;
  const uint64_t beat_every = uint64_t{config().heartbeat_s} * 1'000'000'000;
  uint64_t next_beat = now_ns() + beat_every;
  long wait_ms = kTendMaxMs;
  for (;;) {
    timespec nap{0, wait_ms * 1'000'000};
    nanosleep(&nap, nullptr);
    const bool beat = now_ns() >= next_beat;
    bool handed = false;
    {
      std::lock_guard<std::mutex> lock(g_links_mu);
      if (g_exiting) continue;  // what exit tears down is not ours to look at
      for (VerbsLink* l : g_links) handed |= l->tend();
      if (beat) {
        for (VerbsLink* l : g_links) l->heartbeat_if_idle();
      }
    }
    if (beat) next_beat = now_ns() + beat_every;
    wait_ms = handed ? kTendMinMs : std::min(wait_ms * 2, kTendMaxMs);
  }
}

void VerbsLink::forget_after_fork() {
  new (&g_links_mu) std::mutex();  // only this thread exists now (see Device::forget_after_fork)
  g_links.clear();
  g_heartbeat_started = false;
  ++g_fork_generation;
}

void VerbsLink::say_bye() {
  // Not from a forked child: the send queue's memory is shared with the parent.
  if (!connected_ || !qp_ || !(peer_.reserved[2] & kParamsBye) || fork_generation_ != g_fork_generation) return;
  std::lock_guard<std::mutex> lock(sq_mu_);
  // Never waits for room: a full send queue (a peer gone without a word)
  // leaves the peer to its own flush timeout, as before.
  if (said_bye_ || error() || !sq_has_room(1)) return;
  said_bye_ = true;
  post_ctl_locked(Ctl{kCtlBye, 0, 0, 0, 0, 0});
}

// The QP goes to the error state: the provider stops retrying our writes
// (a stopped reader's RNR) and completes every WR it has not finished with
// a flush error, in order. The first of those starts where our stream in
// the peer's ring ends (all before it completed: acknowledged, so placed).
// Only a QP whose peer is no longer served by it either way: exit, or a
// close giving up.
int VerbsLink::abandon_unconfirmed(uint64_t* confirmed, int timeout_ms) {
  if (!connected_ || !qp_ || fork_generation_ != g_fork_generation) return -ENOTSUP;
  uint8_t last = 0;
  {
    std::lock_guard<std::mutex> cq(cq_->mu);  // completions before sq_mu_, as poll_completions takes them
    poll_completions();
    std::lock_guard<std::mutex> lock(sq_mu_);
    if (error()) return error();
    if (peer_bye_.load(std::memory_order_acquire)) return -ECONNRESET;
    // The last WR must report itself, succeeded or flushed. (Its sequence
    // number is not one of an earlier WR still to report: at most
    // kSendDepth - 4 are outstanding.)
    if (!last_signaled_ && post_marker_locked(data_posted_end_) != 0) return error();
    last = static_cast<uint8_t>(wr_seq_ - 1);
  }
  auto last_reported = [this, last] {
    std::lock_guard<std::mutex> lock(sq_mu_);
    return reported_ && reported_seq_ == last;
  };
  // A state transition, bounded as the setup's are (util/watchdog.h).
  auto moved = std::make_shared<std::atomic<int>>(-ETIMEDOUT);
  ibv_qp* qp = qp_;
  const IbvApi* api = ibv();
  bool in_time = run_bounded(static_cast<uint32_t>(timeout_ms), [moved, qp, api] {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    moved->store(api->modify_qp(qp, &attr, IBV_QP_STATE) == 0 ? 0 : -EIO);
  });
  if (!in_time) {
    // The thread still in the provider has the QP: never destroyed here.
    qp_stuck_.store(true, std::memory_order_relaxed);
    error_.store(-EIO, std::memory_order_relaxed);
    Device::give_up("moving a queue pair to the error state");
    return -ETIMEDOUT;
  }
  if (moved->load() != 0) return moved->load();
  const uint64_t deadline = now_ns() + static_cast<uint64_t>(timeout_ms) * 1'000'000;
  for (;;) {
    {
      std::lock_guard<std::mutex> cq(cq_->mu);
      poll_completions();
    }
    if (last_reported()) break;
    if (now_ns() >= deadline) return -ETIMEDOUT;
    sched_yield();
  }
  std::lock_guard<std::mutex> lock(sq_mu_);
  *confirmed = first_lost_ < data_posted_end_ ? first_lost_ : data_posted_end_;
  return 0;
}

const unsigned char* VerbsLink::staged(uint64_t pos, size_t* contiguous) const {
  // The staging keeps every position from done_ on: in old_tx_ those
  // before old_tx_until_, the rest in tx_ (at the same offset modulo each
  // one's size).
  const uint64_t end = own_tail();
  if (pos < done_.load(std::memory_order_acquire) || pos >= end) return nullptr;
  const Buffer& b = old_tx_.mr && pos < old_tx_until_ ? old_tx_ : tx_;
  const uint64_t until = &b == &old_tx_ ? old_tx_until_ : end;
  const size_t size = &b == &old_tx_ ? old_stage_ : stage_.load(std::memory_order_relaxed);
  const uint64_t off = pos & (size - 1);
  uint64_t n = size - off;
  if (n > until - pos) n = until - pos;
  *contiguous = static_cast<size_t>(n);
  return static_cast<const unsigned char*>(b.data) + off;
}

// Provider calls that can block run under the watchdog. Past the setup
// timeout the connection stays on TCP and the process stops using verbs (a
// provider that blocked once is wedged); the thread left in the provider
// releases what it made if it ever returns.
std::unique_ptr<VerbsLink> VerbsLink::create(Device& dev, size_t ring_size, const sockaddr* local, int* err,
                                             const char** limit) {
  // Within this process's share of the device and its memory budget, or
  // not at all (no provider call, no thread): the connection stays on TCP.
  const uint64_t first = std::min(ring_size, kStartRegion);
  if (Refusal r = dev.admit_link(2 * first + kCtlBytes); r != Refusal::kNone) {
    if (limit) *limit = refusal_text(r);
    return *err = -EDQUOT, nullptr;
  }
  // Its queues are counted once made; until then they are held in reserve.
  struct EndSetup {
    Device& dev;
    ~EndSetup() { dev.end_link_setup(); }
  } end_setup{dev};
  struct Job {
    sockaddr_storage local{};
    bool has_local = false;
    std::unique_ptr<VerbsLink> link;
    int err = -EIO;
    Refusal why = Refusal::kNone;
  };
  auto job = std::make_shared<Job>();
  if (!job) return *err = -ENOMEM, nullptr;
  // The caller's address is copied: the thread may outlive the caller's frame.
  if (local && (local->sa_family == AF_INET || local->sa_family == AF_INET6)) {
    memcpy(&job->local, local, local->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    job->has_local = true;
  }
  Device* d = &dev;  // never destroyed
  bool in_time = run_bounded(
      config().setup_timeout_ms,
      [job, d, ring_size] {
        job->link = create_now(*d, ring_size, job->has_local ? reinterpret_cast<sockaddr*>(&job->local) : nullptr,
                               &job->err, &job->why);
      },
      [job] { job->link.reset(); });
  if (!in_time) {
    Device::give_up("creating a queue pair");
    return *err = -ETIMEDOUT, nullptr;
  }
  *err = job->err;
  if (job->why != Refusal::kNone && limit) *limit = refusal_text(job->why);
  return std::move(job->link);
}

std::unique_ptr<VerbsLink> VerbsLink::create_now(Device& dev, size_t ring_size, const sockaddr* local, int* err,
                                                 Refusal* why) {
  const IbvApi* api = ibv();
  std::unique_ptr<VerbsLink> l(new (std::nothrow) VerbsLink(dev));
  if (!l) return *err = -ENOMEM, nullptr;
  l->ring_size_ = ring_size;
  l->fork_generation_ = g_fork_generation;
  *err = -ENOMEM;
  // The rings start small and grow under pressure (verbs/regions.h).
  size_t first = std::min(ring_size, kStartRegion);
  // Admitted, but another connection may have taken the room meanwhile.
  if (!dev.take(first, true, &l->first_rx_, true, why) || !dev.take(first, false, &l->tx_, true, why) ||
      !dev.take(kCtlBytes, false, &l->ctl_, true, why)) {
    if (*why != Refusal::kNone) dev.say_refused(*why), *err = -EDQUOT;
    return nullptr;
  }
  *err = -EIO;
  l->cq_ = SharedCq::attach(dev, err);
  if (!l->cq_) return nullptr;
  l->doorbell_ = l->cq_->own_fd();
  if (l->doorbell_ < 0) {
    // On a shared CQ, an eventfd: never blocking a check, never a number
    // the program would get on TCP (util/fd_budget.h).
    l->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd_ < 0) return *err = -EIO, nullptr;
    if (!fds::keep(&l->wake_fd_, 1)) return *err = -EMFILE, nullptr;
    l->doorbell_ = l->wake_fd_;
  }
  *err = -EIO;
  ibv_qp_init_attr init{};
  init.send_cq = l->cq_->cq();
  init.recv_cq = l->cq_->cq();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = kSendDepth;
  init.cap.max_recv_wr = kRecvDepth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 256;
  if (RDMASHIM_FAULT(kIbvQpBlock)) fault::block_forever();
  l->qp_ = RDMASHIM_FAULT(kIbvQp) ? nullptr : dev.create_qp(&init);
  if (!l->qp_) {
    init.cap.max_inline_data = 0;  // some providers cannot inline at all
    l->qp_ = RDMASHIM_FAULT(kIbvQp) ? nullptr : dev.create_qp(&init);
  }
  if (!l->qp_) return nullptr;
  l->max_inline_ = init.cap.max_inline_data;
  l->qpn_ = l->qp_->qp_num;
  l->cq_->add(l->qpn_, l.get());

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = dev.port();
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (RDMASHIM_FAULT(kIbvQpInit) || api->modify_qp(l->qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    return nullptr;
  }
  l->repost_receives(kRecvDepth);

  int gid_index = dev.gid_index_for(local);
  ibv_gid gid{};
  if (gid_index < 0 || !dev.gid(gid_index, &gid)) return nullptr;
  uint32_t psn = 0;
  random_bytes(&psn, sizeof psn);
  l->local_.qpn = l->qp_->qp_num;
  l->local_.psn = psn & 0xffffff;
  memcpy(l->local_.gid, gid.raw, sizeof l->local_.gid);
  l->local_.addr = reinterpret_cast<uintptr_t>(l->first_rx_.data);
  l->local_.rkey = l->first_rx_.mr->rkey;
  l->local_.reserved[1] = kParamsElastic;
  l->local_.reserved[2] = kParamsBye;
  l->local_.ring_size = static_cast<uint32_t>(ring_size);
  l->local_.lid = dev.lid();
  l->local_.mtu = static_cast<uint8_t>(dev.mtu());
  l->local_.reserved[0] = static_cast<uint8_t>(gid_index);  // ours, for our own RTR
  *err = 0;
  return l;
}

VerbsLink::~VerbsLink() {
  if (connected_) {
    std::lock_guard<std::mutex> lock(g_links_mu);
    std::erase(g_links, this);
  }
  const IbvApi* api = ibv();
  if (!api) return;
  say_bye();
  if (cq_) cq_->detach(qpn_);  // no completion reaches us from now on
  if (!qp_stuck_.load(std::memory_order_relaxed)) dev_.destroy_qp(qp_);
  if (wake_fd_ >= 0) fds::close(wake_fd_);
  Buffer offered;
  if (connected_ && rx_rgn_.offered(&offered)) dev_.give_back(offered);
  dev_.give_back(connected_ ? rx_rgn_.current() : first_rx_);
  dev_.give_back(tx_);
  dev_.drop(old_tx_);
  dev_.give_back(ctl_);
}

int VerbsLink::connect(const Params& peer, size_t ring) {
  const IbvApi* api = ibv();
  // Untrusted until here: a ring that fits our registration (so neither
  // side ever addresses past what the other registered), fields in range.
  // A peer without elastic regions would write past our first region.
  if (connected_ || !params_plausible(peer) || !ring_size_acceptable(ring, peer.ring_size) ||
      ring > local_.ring_size || peer.reserved[1] != kParamsElastic) {
    return -EPROTO;
  }
  ring_size_ = ring;
  // Both sides' first regions: the first min(kStartRegion, ring) bytes of
  // what each registered (a client may have registered more).
  size_t first = std::min(ring, kStartRegion);
  rx_rgn_.init(first_rx_, first, ring);
  tx_rgn_.init(peer.addr, peer.rkey, first, ring);
  // Both powers of two: a wrap of the ring is also one of the staging.
  stage_.store(std::min(ring, tx_.size), std::memory_order_relaxed);
  peer_ = peer;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(peer.mtu < static_cast<uint8_t>(dev_.mtu()) ? peer.mtu : static_cast<uint8_t>(dev_.mtu()));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = dev_.port();
  if (dev_.ethernet()) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
    a.ah_attr.grh.sgid_index = local_.reserved[0];
    a.ah_attr.grh.hop_limit = 64;
  } else {
    a.ah_attr.dlid = peer.lid;
  }
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;    // 4.096 us * 2^14 = 67 ms per try
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;   // receives are always posted; RNR only in a stall
  rts.sq_psn = local_.psn;
  rts.max_rd_atomic = 1;
  // The thread gets copies and the QP alone: it touches nothing of ours.
  struct Job {
    Leftovers left;
    int err = 0;
  };
  auto job = std::make_shared<Job>();
  if (!job) return -ENOMEM;
  ibv_qp* qp = qp_;
  bool in_time = run_bounded(
      config().setup_timeout_ms,
      [job, api, qp, a, rts]() mutable {
        int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        if (RDMASHIM_FAULT(kIbvQpRtrBlock)) fault::block_forever();
        if (RDMASHIM_FAULT(kIbvQpRtr) || api->modify_qp(qp, &a, mask) != 0) return void(job->err = -errno);
        mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC;
        if (RDMASHIM_FAULT(kIbvQpRts) || api->modify_qp(qp, &rts, mask) != 0) job->err = -errno;
      },
      [job] { job->left.release(); });
  if (!in_time) {
    hand_over_resources(&job->left);
    Device::give_up("moving a queue pair to RTR/RTS");
    return -ETIMEDOUT;
  }
  if (job->err != 0) return job->err;
  connected_ = true;
  std::lock_guard<std::mutex> lock(g_links_mu);
  g_links.push_back(this);
  start_heartbeat_locked();
  return 0;
}

// At exit() the kernel would still deliver what a TCP socket had buffered;
// RDMA WRITEs still in the send queue would die with our QPs instead. One
// second for all links together, not per link (a thousand links to peers
// that are gone would take a thousand seconds): every link's marker is
// posted first, then each waits what is left. Then each says Bye, so its
// peer's close does not wait for a QP that is gone.
// What is still unconfirmed then would reach the peer as a clean end of a
// shorter stream (our FIN): its owner is told (ExitNotice), and resets.
__attribute__((destructor)) static void flush_all_at_exit() {
  std::lock_guard<std::mutex> lock(g_links_mu);
  g_exiting = true;  // the heartbeat thread looks at no link from now on
  for (VerbsLink* l : g_links) l->flush(0);
  const uint64_t deadline = now_ns() + 1'000'000'000;
  for (VerbsLink* l : g_links) {
    uint64_t now = now_ns();
    int r = l->flush(now < deadline ? static_cast<int>((deadline - now) / 1'000'000) : 0);
    if (r == -ETIMEDOUT) l->exit_unconfirmed();
  }
  for (VerbsLink* l : g_links) l->say_bye();
}

void VerbsLink::set_exit_notice(ExitNotice n) {
  std::lock_guard<std::mutex> lock(g_links_mu);
  exit_notice_ = n;
}

}  // namespace rdmashim::verbs
