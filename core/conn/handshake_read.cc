// Reading the handshake's messages off the socket without consuming what
// is not ours: peeking a whole Hello or Ack, waiting for the rest of a
// prefix without a busy loop (SO_RCVLOWAT), and putting the program's own
// low-water mark back.
#include "conn/connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "conn/connection_internal.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/schedule.h"

namespace rdmashim {

// Looks for an rdmashim message (a Hello or an Ack) at the head of the
// incoming stream without consuming anything. `extent` says from its first
// 64 bytes how long the whole message is (a Params frame may follow).
//   1: a whole message starting with `magic` is there, copied to out
//   0: the stream starts with something else (application bytes, or EOF)
//  <0: undecided yet (-EAGAIN, -EINTR, ... exactly what the app's read would see)
int Connection::peek_message(const unsigned char (&magic)[8], size_t (*extent)(const unsigned char*),
                             unsigned char (&out)[wire::kMaxHandshakeMessage], size_t* len, int flags,
                             bool may_wait) {
  unsigned char buf[wire::kMaxHandshakeMessage];
  for (;;) {
    // The first byte is waited for the way the application's read waits;
    // once a prefix is here, wait_prefix() waits (with its deadline).
    bool pending = prefix_deadline_ns_.load(std::memory_order_relaxed) != 0;
    int peek_flags = MSG_PEEK | (may_wait && !pending ? (flags & MSG_DONTWAIT) : MSG_DONTWAIT);
    ssize_t n = sys::real().recv(fd_, buf, sizeof buf, peek_flags);
    int err = errno;
    wire::Match m = n > 0 ? wire::match_magic(magic, buf, static_cast<size_t>(n)) : wire::Match::kNo;
    if (n > 0 && m != wire::Match::kNo && (m == wire::Match::kPartial || n < 64 || static_cast<size_t>(n) < extent(buf))) {
      // A prefix of our message. From an rdmashim peer the rest is already on
      // its way; a plain peer that happened to send these bytes (or stalls)
      // is given the setup timeout, then its bytes are its own.
      int r = wait_prefix(static_cast<size_t>(n), may_wait && !nonblocking(flags));
      if (r <= 0) return r;
      continue;
    }
    if (pending) end_prefix();
    if (n < 0) return -err;
    if (m == wire::Match::kNo) return 0;  // application bytes, or EOF
    *len = extent(buf);
    memcpy(out, buf, *len);
    return 1;
  }
}

// `have` bytes that are a true prefix of our message wait at the head of the
// stream. Never spins: SO_RCVLOWAT is raised to have + 1 so that neither
// this poll nor the application's poll/epoll wake before more bytes (or FIN)
// come, and the hooks bound their sleeps by prefix_deadline().
//   1: look again (more bytes, or a signal); 0: the bytes are the
//   application's (deadline passed, or the peer ended); -EAGAIN: not yet.
int Connection::wait_prefix(size_t have, bool block) {
  uint64_t now = now_ns(), dl = prefix_deadline_ns_.load(std::memory_order_relaxed);
  if (dl == 0) {
    dl = now + uint64_t{config().setup_timeout_ms} * 1'000'000;
    prefix_deadline_ns_.store(dl, std::memory_order_relaxed);
  }
  {
    std::lock_guard<std::mutex> lock(lowat_mu_);
    if (app_lowat_.load(std::memory_order_relaxed) < 0) {
      int v = 1;
      socklen_t len = sizeof v;
      if (sys::real().getsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, &len) != 0 || v < 1) v = 1;
      app_lowat_.store(v, std::memory_order_relaxed);
      raised_lowat_ = v;
    }
    // An application mark above ours already keeps the kernel quiet, as it would on TCP.
    prefix_need_ = static_cast<int>(have) + 1;
    int want = std::max(prefix_need_, app_lowat_.load(std::memory_order_relaxed));
    if (want != raised_lowat_ && sys::real().setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) {
      raised_lowat_ = want;
    }
  }
  int timeout = block && now < dl ? static_cast<int>((dl - now + 999'999) / 1'000'000) : 0;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  int r = sys::wait(&p, 1, timeout);  // the program's own way of sleeping
  // The peer ended (or reset): the message can never complete.
  bool ended = r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
  if (r > 0 && !ended && !(p.revents & POLLRDHUP) && sys::select_like(sys::wait_call())) {
    // select says "readable" for an end too: no byte past the prefix is one.
    unsigned char b[wire::kMaxHandshakeMessage + 1];
    ssize_t n = sys::real().recv(fd_, b, std::min(have + 1, sizeof b), MSG_PEEK | MSG_DONTWAIT);
    ended = n < 0 ? errno != EAGAIN && errno != EINTR : static_cast<size_t>(n) <= have;
  }
  if (ended || now_ns() >= dl) {
    end_prefix();
    return 0;
  }
  if (r > 0) return 1;  // more bytes: look again
  return block ? 1 : -EAGAIN;
}

// Leaves the prefix state: SO_RCVLOWAT back to the application's value.
void Connection::end_prefix() {
  std::lock_guard<std::mutex> lock(lowat_mu_);
  prefix_deadline_ns_.store(0, std::memory_order_relaxed);
  int v = app_lowat_.load(std::memory_order_relaxed);
  if (v < 0) return;
  if (raised_lowat_ != v) sys::real().setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
  app_lowat_.store(-1, std::memory_order_relaxed);
  rcvlowat_.store(v, std::memory_order_relaxed);  // the application's again
}

// The application set SO_RCVLOWAT (the kernel has it now): its value is kept
// for the data path (and siblings told). While a prefix is pending, it
// becomes the value to restore, and ours goes back on.
void Connection::rcvlowat_changed(int value) {
  rcvlowat_.store(value, std::memory_order_relaxed);
  options_shared_changed();
  std::lock_guard<std::mutex> lock(lowat_mu_);
  if (app_lowat_.load(std::memory_order_relaxed) < 0) return;
  int v = value;
  socklen_t len = sizeof v;
  if (v < 1 && (sys::real().getsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, &len) != 0 || v < 1)) v = 1;
  app_lowat_.store(v, std::memory_order_relaxed);
  int want = std::max(prefix_need_, v);
  raised_lowat_ = v;
  if (want != v && sys::real().setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) raised_lowat_ = want;
}

size_t conn_internal::ack_extent(const unsigned char* m) {
  wire::Ack a;
  memcpy(&a, m, sizeof a);
  return sizeof a + (a.transport == wire::kTransportVerbs ? sizeof(wire::ParamsFrame) : 0);
}

}  // namespace rdmashim
