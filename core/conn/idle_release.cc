// Elastic rings give memory back: the registry of connections whose rings
// hold pages worth releasing, and the releases themselves, run when this
// process is about to sleep in our hooks or closes (never on the data path,
// never from a thread of ours: a sandboxed program sees only its own calls
// plus an madvise now and then).
#include <algorithm>
#include <mutex>
#include <vector>

#include "conn/connection.h"
#include "util/misc.h"
#include "util/process.h"

namespace rdmashim {
namespace {

std::mutex g_mu;
std::vector<Connection*>* g_listed = nullptr;  // never freed: used until exit

}  // namespace

std::atomic<uint32_t> Connection::idle_count_{0};

void Connection::list_idle() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_listed) g_listed = new (std::nothrow) std::vector<Connection*>();
  if (!g_listed) return;
  g_listed->push_back(this);
  idle_listed_.store(true, std::memory_order_relaxed);
  idle_count_.store(static_cast<uint32_t>(g_listed->size()), std::memory_order_relaxed);
}

void Connection::forget_idle() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_listed) return;
  auto& v = *g_listed;
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
  idle_count_.store(static_cast<uint32_t>(v.size()), std::memory_order_relaxed);
}

// Returns when a rate-limited release is due (0: not waiting for time);
// *done when the connection leaves the list.
uint64_t Connection::release_idle(uint64_t now, bool* done) {
  *done = false;
  std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);
  if (!tx.owns_lock()) return 0;  // busy: it is not idle
  if (!ring_ || orphaned_ || parents_transport_) {
    *done = true;
    return 0;
  }
  // A forked sibling may write this ring too: it stays as it is.
  if (transport_->shared()) return 0;
  if (ring_->maintained()) {
    // Registered memory (verbs): listed while it has something to do. rx_mu_
    // comes before tx_mu_ elsewhere, hence only tried.
    std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
    uint64_t due = transport_->link().maintain(now, true, rx.owns_lock());
    *done = due == 0 && !ring_->maintenance_wanted();
    return due;
  }
  if (last_release_ns_ != 0 && now - last_release_ns_ < kReleaseIntervalNs) return last_release_ns_ + kReleaseIntervalNs;
  if (!ring_->release_tx()) return 0;  // the reader has not drained it yet
  last_release_ns_ = now;
  *done = true;
  return 0;
}

uint64_t Connection::release_idle_memory(const Connection* held) {
  // Under a seccomp filter the release's madvise is a call the program did not make.
  if (idle_count_.load(std::memory_order_relaxed) == 0 || sandbox() != Sandbox::kNone) return 0;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_listed) return 0;
  uint64_t now = now_ns(), due = 0;
  auto& v = *g_listed;
  for (size_t i = 0; i < v.size();) {
    Connection* c = v[i];
    bool done = false;
    uint64_t at = c == held ? 0 : c->release_idle(now, &done);
    if (at != 0 && (due == 0 || at < due)) due = at;
    if (done) {
      c->idle_listed_.store(false, std::memory_order_relaxed);
      v[i] = v.back();
      v.pop_back();
    } else {
      ++i;
    }
  }
  idle_count_.store(static_cast<uint32_t>(v.size()), std::memory_order_relaxed);
  return due;
}

// The peer shut down writing or closed: nothing will be written into our rx
// ring again, and we drained it (or are closing).
void Connection::release_rx_for_good() {
  if (rx_released_ || !ring_ || !transport_ || transport_->shared()) return;
  rx_released_ = true;
  ring_->release_rx();
}

}  // namespace rdmashim
