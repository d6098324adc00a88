// Completion queues shared by a process's verbs links: a thousand
// connections use a few CQs, not a thousand.
//
//   pool:     a link's QP sends and receives through one CQ of the process's
//             pool (attach()). A CQ serves a bounded number of links, each
//             able to leave kCqesPerLink completions unpolled, so it never
//             overflows: the first serves 8 links, each next one twice as
//             many, up to 64 (and what the device's max_cqe allows). A CQ
//             lives as long as the process (its room is reused).
//   polling:  whoever polls a CQ (a link's reader or writer, a flush, the
//             heartbeat, the watcher below) hands each completion to the
//             link its QP number names, under the CQ's mutex, which guards
//             what completions update in every link of that CQ.
//   sleeping: a link has its own doorbell, an eventfd (its wait_fd). A
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

  // Room for one more link on a CQ of this process's pool: the first CQ with
  // room, else a new one (the first time also the completion channel and
  // the watcher thread). nullptr with *err (-EIO; -EMFILE: no descriptor
  // room for the channel) when none can be made. A provider call: run it
  // under the watchdog.
  static SharedCq* attach(Device& dev, int* err);
  // In a forked child: the parent's CQs, channel and watcher are not ours.
  static void forget_after_fork();

  // Completions for QP `qpn` go to `link` from now on (until remove()).
  void add(uint32_t qpn, VerbsLink* link);
  // The link is going (its QP destroyed or about to be): its completions
  // are dropped from now on, and its room is free again. Once per attach();
  // qpn 0: no QP was added.
  void detach(uint32_t qpn);

  // Everything queued, handed to the links; the caller holds mu.
  void poll_locked();
  // Sleepers on this CQ's links: the watcher re-arms it while there are any.
  void sleep_begins();
  void sleep_ends() { sleepers_.fetch_sub(1, std::memory_order_seq_cst); }

  ibv_cq* cq() const { return cq_; }
  // Polling this CQ and every link state its completions update.
  std::mutex mu;

 private:
  friend void* watch_completions(void*);
  SharedCq(ibv_cq* cq, int capacity) : cq_(cq), capacity_(capacity) {}
  void on_event();  // the watcher: an armed CQ got a completion

  ibv_cq* const cq_;
  const int capacity_;            // links it may serve
  int attached_ = 0;              // under the pool's lock
  std::atomic<int> sleepers_{0};
  std::unordered_map<uint32_t, VerbsLink*> links_;  // under mu
  VerbsLink* last_ = nullptr;     // under mu: the last link a completion went to
  uint32_t last_qpn_ = 0;
};

void* watch_completions(void*);

}  // namespace rdmashim::verbs
