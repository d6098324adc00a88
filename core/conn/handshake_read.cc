// Reading the handshake's messages off the socket without consuming what
// is not ours: peeking a whole Hello or Ack, waiting for the rest of a
// prefix without a busy loop (SO_RCVLOWAT), and putting the program's own
// low-water mark back. And the server's first blocking read, which reads
// before it looks (read_first): a plain client's bytes cost no peek.
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
    if (m == wire::Match::kNo) {  // application bytes, or EOF
      look_saw_bytes_.store(n > 0, std::memory_order_relaxed);
      return 0;
    }
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

// ---------------------------------------------------------------------------
// Reading first: the server's first read straight into the program's buffer

// The program's buffer for read_first, or nullptr: a plain read (no flags:
// one that must not wait, peeks or drops keeps the look first) into one
// buffer that holds at least the Hello's magic, on a socket that blocks,
// no prefix pending from an earlier look.
const iovec* Connection::read_first_into(const iovec* iov, int iovcnt, int flags) const {
  if (flags != 0 || !blocks_.load(std::memory_order_relaxed) ||
      prefix_deadline_ns_.load(std::memory_order_relaxed) != 0) {
    return nullptr;
  }
  const iovec* into = nullptr;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    if (into) return nullptr;  // the bytes could spread over several
    into = &iov[i];
  }
  return into && into->iov_len >= sizeof wire::kHelloMagic ? into : nullptr;
}

// Looking for a Hello first (a peek) costs every connection one call more
// than on TCP, and nearly every client is plain. So a blocking read takes
// what is there into the program's buffer and looks after: anything but a
// Hello is the program's, as read. A Hello is taken (complete_hello), and
// the frames that came with it are unframed in place (unframe).
// false: a Hello was taken and nothing is here for the program yet.
bool Connection::read_first(const iovec& into, int flags, ssize_t* result) {
  auto* buf = static_cast<unsigned char*>(into.iov_base);
  ssize_t n = tcp_recv(&into, 1, flags);
  if (n < 0) {  // nothing taken: a signal, a timeout, an error, as the program's read
    *result = n;
    return true;
  }
  size_t have = static_cast<size_t>(n);
  unsigned char msg[wire::kMaxHandshakeMessage];
  size_t len = 0;
  if (have > 0 && wire::match_magic(wire::kHelloMagic, buf, have) != wire::Match::kNo) {
    len = complete_hello(into, &have, msg);
  }
  RDMASHIM_SCHED_POINT(kHandshakeDetectHello);
  auto tx = lock_tx_for_handler();
  in_setup_.store(false, std::memory_order_relaxed);
  end_hold();
  if (len == 0) {  // a plain client (or EOF)
    client_is_plain();
    *result = static_cast<ssize_t>(have);
    return true;
  }
  take_hello(msg, len);
  tx.unlock();
  *result = have > len ? unframe(buf, len, have) : 0;
  return *result != 0;
}

// `*have` bytes that begin like a Hello are in the program's buffer `into`.
// Returns the length of the whole Hello, then in `msg`, or 0: the `*have`
// bytes (more, perhaps) are the program's. Past the program's buffer the
// Hello is only peeked at until it is all there, then taken: nothing is
// taken that the program could not be given.
// From an rdmashim client the rest is here already (its Hello leaves in one
// send, smaller than any segment). A plain client that sent such bytes by
// chance gets them back once it sends something else or ends, or after the
// setup timeout, as when a look finds a prefix (wait_prefix); on a socket
// that turns out not to block (a sibling process changed it), after
// kHoldInCallMs.
size_t Connection::complete_hello(const iovec& into, size_t* have, unsigned char (&msg)[wire::kMaxHandshakeMessage]) {
  auto* buf = static_cast<unsigned char*>(into.iov_base);
  uint64_t until = 0;
  for (;;) {
    wire::Match m = wire::match_magic(wire::kHelloMagic, buf, *have);
    if (m == wire::Match::kNo) return 0;
    bool some = false;  // bytes are there, not enough yet: the socket reads as ready
    if (m == wire::Match::kYes) {
      size_t got = std::min(*have, sizeof msg);
      memcpy(msg, buf, got);
      if (got >= sizeof(wire::Hello) && got >= conn_internal::hello_extent(msg)) return conn_internal::hello_extent(msg);
      ssize_t p = sys::real().recv(fd_, msg + got, sizeof msg - got, MSG_PEEK | MSG_DONTWAIT);
      int err = errno;
      size_t there = got + static_cast<size_t>(std::max<ssize_t>(p, 0));
      size_t need = there < sizeof(wire::Hello) ? sizeof(wire::Hello) : conn_internal::hello_extent(msg);
      if (there >= need) {
        ssize_t r = sys::real().recv(fd_, msg + got, need - got, MSG_DONTWAIT);  // it is all there
        return r == static_cast<ssize_t>(need - got) ? need : 0;
      }
      if (p == 0 || (p < 0 && err != EAGAIN && err != EINTR)) return 0;  // the end, or an error the next read sees
      some = p > 0;
    } else {  // a piece of the magic: its rest fits the program's buffer
      iovec rest{buf + *have, into.iov_len - *have};
      ssize_t r = until == 0 ? -EAGAIN : tcp_recv(&rest, 1, MSG_DONTWAIT);
      if (r > 0) {
        *have += static_cast<size_t>(r);
        continue;
      }
      if (r == 0 || (r != -EAGAIN && r != -EINTR)) return 0;
    }
    uint64_t now = now_ns();
    if (until == 0) {
      uint64_t ms = nonblocking(0) ? kHoldInCallMs : config().setup_timeout_ms;
      until = now + ms * 1'000'000;
      RDMASHIM_DEBUG("fd %d: the first %zu bytes begin like a Hello: waiting up to %llu ms for the rest", fd(), *have,
                     static_cast<unsigned long long>(ms));
    }
    if (now >= until) return 0;
    int ms = static_cast<int>((until - now + 999'999) / 1'000'000);
    pollfd p{fd_, POLLIN, 0};
    if (some) sys::wait(nullptr, 0, 1);  // the program's own way of sleeping
    else sys::wait(&p, 1, ms);
  }
}

// Receive lock held, after a Hello taken by read_first. The bytes at
// [pos, end) of `buf` came with it: frames (after a Plain, raw bytes), sent
// before the client had our Ack. They are taken as read_frame takes them off
// the socket, a piece of a header or control frame kept in rx_hdr_/rx_ctl_,
// and the program's bytes move to the front of `buf`. Returns their count,
// or -errno (the stream broken).
ssize_t Connection::unframe(unsigned char* buf, size_t pos, size_t end) {
  size_t out = 0;
  while (pos < end) {
    size_t left = end - pos;
    if (rx_ == Rx::kRaw) {
      memmove(buf + out, buf + pos, left);
      return static_cast<ssize_t>(out + left);
    }
    // A Switch follows our Ack, which left after these bytes came.
    if (rx_ != Rx::kFramed) return broken("bytes past a switch that came before our ack");
    if (rx_frame_left_ > 0) {
      size_t take = std::min<size_t>(rx_frame_left_, left);
      memmove(buf + out, buf + pos, take);
      out += take;
      pos += take;
      rx_frame_left_ -= static_cast<uint32_t>(take);
      continue;
    }
    size_t take = std::min<size_t>(sizeof rx_hdr_ - rx_hdr_have_, left);
    memcpy(reinterpret_cast<unsigned char*>(&rx_hdr_) + rx_hdr_have_, buf + pos, take);
    rx_hdr_have_ += static_cast<uint32_t>(take);
    pos += take;
    if (rx_hdr_have_ < sizeof rx_hdr_) break;
    if (!wire::valid(rx_hdr_)) return broken("malformed frame header");
    if (rx_hdr_.type != static_cast<uint16_t>(wire::FrameType::kData)) {
      take = std::min<size_t>(rx_hdr_.length - rx_ctl_have_, end - pos);
      memcpy(rx_ctl_ + rx_ctl_have_, buf + pos, take);
      rx_ctl_have_ += static_cast<uint32_t>(take);
      pos += take;
      if (rx_ctl_have_ < rx_hdr_.length) break;
    }
    int r = take_frame();
    if (r < 0) return r;
  }
  return static_cast<ssize_t>(out);
}

size_t conn_internal::hello_extent(const unsigned char* m) {
  wire::Hello h;
  memcpy(&h, m, sizeof h);
  return sizeof h + ((h.transports & wire::kTransportVerbs) ? sizeof(wire::ParamsFrame) : 0);
}

size_t conn_internal::ack_extent(const unsigned char* m) {
  wire::Ack a;
  memcpy(&a, m, sizeof a);
  return sizeof a + (a.transport == wire::kTransportVerbs ? sizeof(wire::ParamsFrame) : 0);
}

}  // namespace rdmashim
