#include "verbs/shared_cq.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <new>
#include <vector>

#include "sys/sys.h"
#include "util/fault.h"
#include "util/fd_budget.h"
#include "util/thread.h"
#include "verbs/device.h"
#include "verbs/ibv_api.h"
#include "verbs/verbs_link.h"

namespace rdmashim::verbs {
namespace {

constexpr int kFirstLinks = 8;  // the first CQ's links; each next one doubles
constexpr int kMostLinks = 64;  // 32,768 entries: rxe's max_cqe

// Leaked on purpose: the watcher and the exit flush may use it to the end.
struct Pool {
  std::vector<SharedCq*> own;  // CQs of one link each, with their channels
  ibv_comp_channel* channel = nullptr;  // the shared CQs'
  bool watching = false;
  std::vector<SharedCq*> cqs;  // shared
};
std::mutex g_pool_mu;
Pool* g_pool = nullptr;

}  // namespace

SharedCq* SharedCq::attach(Device& dev, int* err) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = new (std::nothrow) Pool;
  if (!g_pool) return *err = -ENOMEM, nullptr;
  Pool& p = *g_pool;
  for (SharedCq* c : p.own) {
    if (c->attached_ == 0) {
      c->attached_ = 1;
      return c;
    }
  }
  if (p.own.size() < kOwnCqs) {
    *err = -EIO;
    ibv_comp_channel* channel = RDMASHIM_FAULT(kIbvChannel) ? nullptr : dev.create_channel(err);
    if (!channel) return nullptr;
    SharedCq* c = make(dev, 1, channel, true, err);
    if (!c) {
      dev.destroy_channel(channel);
      return nullptr;
    }
    p.own.push_back(c);
    return c;
  }
  for (SharedCq* c : p.cqs) {
    if (c->attached_ < c->capacity_) {
      ++c->attached_;
      return c;
    }
  }
  if (!p.channel) {
    *err = -EIO;
    p.channel = RDMASHIM_FAULT(kIbvChannel) ? nullptr : dev.create_channel(err);
    if (!p.channel) return nullptr;
  }
  if (!p.watching) {
    p.watching = start_background_thread(watch_completions, p.channel);
    if (!p.watching) return *err = -EAGAIN, nullptr;
  }
  int links = std::min(kFirstLinks << std::min<size_t>(p.cqs.size(), 8), kMostLinks);
  if (int most = dev.max_cqe() / kCqesPerLink; most > 0 && links > most) links = most;
  SharedCq* c = make(dev, links, p.channel, false, err);
  if (c) p.cqs.push_back(c);
  return c;
}

SharedCq* SharedCq::make(Device& dev, int links, ibv_comp_channel* channel, bool own, int* err) {
  ibv_cq* cq = RDMASHIM_FAULT(kIbvCq) ? nullptr : dev.create_cq(links * kCqesPerLink, channel);
  if (!cq) return *err = -EIO, nullptr;
  auto* c = new (std::nothrow) SharedCq(dev, cq, links, own ? channel : nullptr);
  if (!c) {
    dev.destroy_cq(cq);
    return *err = -ENOMEM, nullptr;
  }
  cq->cq_context = c;  // what ibv_get_cq_event hands the watcher
  c->attached_ = 1;
  *err = 0;
  return c;
}

void SharedCq::forget_after_fork() {
  new (&g_pool_mu) std::mutex();  // only this thread exists now
  if (g_pool) {  // our copies of their descriptors
    for (SharedCq* c : g_pool->own) fds::close(c->own_->fd);
    if (g_pool->channel) fds::close(g_pool->channel->fd);
  }
  g_pool = nullptr;  // the parent's, leaked here as the device is
}

void SharedCq::add(uint32_t qpn, VerbsLink* link) {
  std::lock_guard<std::mutex> lock(mu);
  links_[qpn] = link;
}

void SharedCq::remove(uint32_t qpn) {
  std::lock_guard<std::mutex> lock(mu);
  links_.erase(qpn);
  if (last_qpn_ == qpn) last_ = nullptr, last_qpn_ = 0;
}

void SharedCq::detach(uint32_t qpn) {
  if (qpn != 0) remove(qpn);
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    if (--attached_ > 0 || own_) return;
    std::erase(g_pool->cqs, this);  // no attach() finds it, no event is handed to it
  }
  // Outside the pool's lock: ibv_destroy_cq waits until the watcher acked
  // an event it may hold for this CQ, and the watcher takes that lock first.
  dev_.destroy_cq(cq_);
  delete this;
}

void SharedCq::sleep_begins() {
  if (!own_) sleepers_.fetch_add(1, std::memory_order_seq_cst);  // for the watcher, which has no own CQ
  ibv_req_notify_cq(cq_, 0);
}

void SharedCq::take_own_events() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  unsigned n = 0;
  while (ibv()->get_cq_event(own_, &cq, &ctx) == 0) ++n;
  if (n) ibv()->ack_cq_events(cq_, n);
}

int SharedCq::poll_locked() {
  ibv_wc wc[32];
  int handed = 0;
  ++polls_;
  for (;;) {
    int n = ibv_poll_cq(cq_, 32, wc);
    if (n <= 0) {
      if (n < 0) {
        for (auto& [qpn, link] : links_) link->cq_failed();
      }
      return handed;
    }
    handed += n;
    // Each link touched by this batch, once: receives reposted, sleepers woken.
    VerbsLink* touched[32];
    int t = 0;
    for (int i = 0; i < n; ++i) {
      VerbsLink* link = last_;
      if (wc[i].qp_num != last_qpn_ || !link) {
        auto it = links_.find(wc[i].qp_num);
        if (it == links_.end()) continue;  // a link gone: its QP's last completions
        link = last_ = it->second;
        last_qpn_ = wc[i].qp_num;
      }
      link->on_completion(wc[i]);
      if (std::find(touched, touched + t, link) == touched + t) touched[t++] = link;
    }
    for (int i = 0; i < t; ++i) touched[i]->after_completions();
    if (n < 32) return handed;  // it was empty then: a later completion is the next poll's
  }
}

bool SharedCq::tend(bool* unwatched) {
  *unwatched = false;
  if (!mu.try_lock()) return false;  // being polled now
  bool handed = false;
  // A CQ polled since the last look has a program looking at it: left alone.
  *unwatched = polls_ == polls_tended_;
  if (*unwatched) handed = poll_locked() > 0;
  polls_tended_ = polls_;
  mu.unlock();
  return handed;
}

void SharedCq::on_event() {
  // An event is one-shot: armed again first, then polled, so a completion
  // between the two still makes an event.
  if (sleepers_.load(std::memory_order_seq_cst) > 0) ibv_req_notify_cq(cq_, 0);
  std::lock_guard<std::mutex> lock(mu);
  poll_locked();
}

void* watch_completions(void* arg) {
  auto* channel = static_cast<ibv_comp_channel*>(arg);
  for (;;) {
    pollfd p{channel->fd, POLLIN, 0};
    if (sys::real().poll(&p, 1, -1) <= 0) continue;
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv()->get_cq_event(channel, &cq, &ctx) == 0) {
      {
        // Only a CQ still in the pool: one whose last link went may be
        // being destroyed (its destruction waits for the ack below).
        std::lock_guard<std::mutex> lock(g_pool_mu);
        auto& cqs = g_pool->cqs;
        if (std::find(cqs.begin(), cqs.end(), static_cast<SharedCq*>(ctx)) != cqs.end()) {
          static_cast<SharedCq*>(ctx)->on_event();
        }
      }
      ibv()->ack_cq_events(cq, 1);
    }
  }
  return nullptr;
}

}  // namespace rdmashim::verbs
