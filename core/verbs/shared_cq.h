// Completion queues shared by a process's verbs links: a thousand
// connections use a few CQs, not a thousand.
//
//   own:      the first kOwnCqs links alive in a process each get a CQ of
//             their own, whose completion channel is their doorbell: a
//             sleeper is woken by the CQ's event itself. (Through the shared
//             CQs' watcher below a sleeping 64 B ping-pong ran at a third of
//             that rate in a Soft-RoCE guest: one more thread hop per wait.)
//   pool:     the other links share CQs: a CQ serves a bounded number of
//             links, each able to leave kCqesPerLink completions unpolled,
//             so it never overflows: the first serves 8 links, each next one
//             twice as many, up to 64 (and what the device's max_cqe
//             allows). The room a link leaves is reused; a shared CQ whose
//             last link went is destroyed, the 8 own ones are kept.
//   polling:  whoever polls a CQ (a link's reader or writer, a flush, the
//             heartbeat, the watcher below) hands each completion to the
//             link its QP number names, under the CQ's mutex, which guards
//             what completions update in every link of that CQ.
//   tending:  a program away from its sockets polls nothing, and each
//             message a writer sends takes one of the reader's posted
//             receives, reposted only as completions are handed over: so
//             the heartbeat thread polls a CQ nobody polled since its last
//             look (tend()), and a writer's messages keep landing in the
//             reader's ring while it is away, as in TCP's buffers.
//   sleeping: a link on a shared CQ has its own doorbell, an eventfd. A
//             sleeper counts itself on the link and on the CQ, then arms
//             the CQ, then re-checks (Link::prepare_sleep). Whoever hands a
//             completion to a link with sleepers rings its doorbell, once
//             until the last sleeper drained it. One watcher thread per
//             process sleeps on the completion channel all CQs share: an
//             event means an armed CQ got a completion; it re-arms the CQ
//             while sleepers remain (an event is one-shot), then polls it.
//             Nothing polls or wakes while nobody sleeps: a spinning pair
//             never pays for the thread.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace rdmashim::verbs {

class Device;
class VerbsLink;

class SharedCq {
 public:
  // The most completions one link may leave in its CQ: every send and
  // receive it can have outstanding (VerbsLink's queue depths).
  static constexpr int kCqesPerLink = 512;
  // Links that get a CQ (and channel) of their own.
  static constexpr int kOwnCqs = 8;

  // Room for one more link: a CQ of its own while fewer than kOwnCqs are in
  // use, else a shared CQ with room, else a new shared one (the first time
  // also the shared completion channel and the watcher thread). nullptr with *err (-EIO; -EMFILE: no descriptor
  // room for the channel) when none can be made. A provider call: run it
  // under the watchdog.
  static SharedCq* attach(Device& dev, int* err);
  // In a forked child: the parent's CQs, channel and watcher are not ours.
  static void forget_after_fork();

  // Completions for QP `qpn` go to `link` from now on (until remove()).
  void add(uint32_t qpn, VerbsLink* link);
  // ... and from now on are dropped: the link is going, its QP may live on
  // (a transition that timed out: Leftovers in verbs_link_setup.cc).
  void remove(uint32_t qpn);
  // The link's QP is destroyed or about to be: remove(qpn), and its room
  // is free again; a shared CQ left without links is destroyed (this object
  // too). Once per attach(); qpn 0: no QP was added, or it was removed.
  void detach(uint32_t qpn);

  // Everything queued, handed to the links; the caller holds mu. How many.
  int poll_locked();
  // The heartbeat thread's look: polls the CQ unless someone else polled it
  // since the last look or holds it now (never waits for mu). true if it
  // handed over any completion; *unwatched: nobody else had polled it.
  bool tend(bool* unwatched);
  // Sleepers on this CQ's links: the watcher re-arms it while there are any.
  void sleep_begins();
  void sleep_ends() {
    if (!own_) sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }

  ibv_cq* cq() const { return cq_; }
  // A CQ of one link's own: its channel is that link's doorbell (-1: shared).
  int own_fd() const { return own_ ? own_->fd : -1; }
  // A link's sleep on its own CQ ended: the events it was woken by, taken.
  void take_own_events();
  // Polling this CQ and every link state its completions update.
  std::mutex mu;

 private:
  friend void* watch_completions(void*);
  SharedCq(Device& dev, ibv_cq* cq, int capacity, ibv_comp_channel* own)
      : dev_(dev), cq_(cq), capacity_(capacity), own_(own) {}
  // A CQ for `links` links on `channel`, one link's own (it keeps the
  // channel) or the pool's; attached once. Destroys what it made on failure.
  static SharedCq* make(Device& dev, int links, ibv_comp_channel* channel, bool own, int* err);
  void on_event();  // the watcher: an armed CQ got a completion

  Device& dev_;
  ibv_cq* const cq_;
  const int capacity_;            // links it may serve
  ibv_comp_channel* const own_;   // one link's own CQ: its channel (never the watcher's)
  int attached_ = 0;              // under the pool's lock
  std::atomic<int> sleepers_{0};  // a shared CQ's only (own CQs need no watcher)
  std::unordered_map<uint32_t, VerbsLink*> links_;  // under mu
  VerbsLink* last_ = nullptr;     // under mu: the last link a completion went to
  uint32_t last_qpn_ = 0;
  uint64_t polls_ = 0, polls_tended_ = 0;  // under mu: polls made, and at tend()'s last look
};

void* watch_completions(void*);

}  // namespace rdmashim::verbs
