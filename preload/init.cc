// Process-level plumbing: resolving the real calls, fork generations, and
// finding the stream behind a descriptor.
#include <pthread.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "conn/thread_epoll.h"
#include "preload.h"
#include "util/config.h"
#include "wait_common.h"
#include "util/fd_budget.h"
#include "util/process.h"
#include "util/stats.h"

namespace rdmashim::preload {
namespace {

std::atomic<bool> g_ready{false};

void before_fork() {
  // Runs in the parent with its other threads still running: only entries
  // that stay alive while we look (the table holds a reference) are touched.
  table().for_each_fd([](int fd) {
    Ref e = table().get(fd);
    if (e && e->conn) e->conn->settle_before_fork();
  });
  hold_kicks_for_fork();
  fds::hold_for_fork();  // last: the settles above may place descriptors
}

void on_fork_parent() {
  release_kicks_after_fork(false);
  fds::release_after_fork();
}

void on_fork_child() {
  fds::release_after_fork();
  note_fork_child();
  table().reset_locks_after_fork();
  stats::after_fork_child();
  thread_epoll::after_fork_child();  // the parent's instance, not ours
  release_kicks_after_fork(true);    // the same
  // Connections already on a shared-memory ring are now used by two
  // processes (duplicated descriptors share one entry: count each once).
  std::vector<Entry*> seen;
  table().for_each_unlocked([&](Entry* e) {
    if (e->conn && std::find(seen.begin(), seen.end(), e) == seen.end()) {
      seen.push_back(e);
      e->conn->on_fork_child();
    }
  });
}

void initialize() {
  sys::init(sys::Source::kNextObject);
  (void)config();
  pthread_atfork(before_fork, on_fork_parent, on_fork_child);
}

pthread_once_t g_once = PTHREAD_ONCE_INIT;

__attribute__((constructor)) void on_load() {
  pthread_once(&g_once, initialize);
  g_ready.store(true, std::memory_order_release);
  detect_inherited_sandbox();
  adopt_inherited();  // needs the real calls, so after initialize()
}

// A pending non-blocking connect that has completed becomes a client stream
// now: this is its first I/O, and the Hello goes out before any of its bytes.
void settle_pending(int fd, Entry& e) {
  {
    std::lock_guard<std::mutex> lock(e.mu);
    if (e.kind.load() != Entry::Kind::kPending) return;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
      // Still connecting: ask again at the next call. Failed: plain for good.
      // TCP_INFO, not SO_ERROR: reading SO_ERROR would consume the error the
      // application is about to ask for.
      tcp_info ti{};
      socklen_t tlen = sizeof ti;
      if (real().getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tlen) == 0 && ti.tcpi_state == TCP_SYN_SENT) return;
    }
    e.kind.store(Entry::Kind::kStream);  // no connection object: plain
  }
  if (Entry* marker = table().take(fd)) unref(marker);
  if (e.conn == nullptr && e.peer_len > 0) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
      track_client(fd, reinterpret_cast<sockaddr*>(&e.peer), e.peer_len, e.advertised, std::move(e.announce), e.probe,
                   e.connected_ns);
    }
  }
}

}  // namespace

const sys::Table& real() {
  if (!g_ready.load(std::memory_order_acquire)) pthread_once(&g_once, initialize);
  return sys::real();
}

Ref active_stream(int fd) {
  Ref e = table().get_unless_plain(fd);
  if (!e) return e;
  Entry::Kind kind = e->kind.load(std::memory_order_relaxed);
  if (kind == Entry::Kind::kPending) {
    int saved = errno;
    settle_pending(fd, *e.get());
    errno = saved;
    e = table().get(fd);
    if (!e) return e;
    kind = e->kind.load(std::memory_order_relaxed);
  }
  if (kind != Entry::Kind::kStream) return Ref();
  if (!e->conn || e->conn->passthrough()) {
    table().mark_plain(fd, e.get());  // for good: the next call costs one load
    return Ref();
  }
  return e;
}

}  // namespace rdmashim::preload
