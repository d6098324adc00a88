// How large a shared-memory ring must be so that a connection never buffers
// less than the same TCP connection would (ring_limits.h).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "ring/ring_limits.h"
#include "sys/sys.h"
#include "util/config.h"

namespace rdmashim {
namespace {

// The third (maximum) value of a tcp_wmem / tcp_rmem line; fallback: the
// kernel's default.
uint64_t sysctl_max(const char* path, uint64_t fallback) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);  // not a hooked call
  if (fd < 0) return fallback;
  char buf[96] = {};
  ssize_t n = sys::real().read(fd, buf, sizeof buf - 1);
  sys::real().close(fd);
  unsigned long long lo = 0, def = 0, max = 0;
  if (n <= 0 || sscanf(buf, "%llu %llu %llu", &lo, &def, &max) != 3) return fallback;
  return max;
}

// Read once per process: the limits rarely change and a sandboxed process
// may not be allowed to open /proc later.
uint64_t cached_sysctl_max(std::atomic<uint64_t>& cached, const char* path, uint64_t fallback) {
  uint64_t v = cached.load(std::memory_order_relaxed);
  if (v == 0) {
    v = sysctl_max(path, fallback);
    cached.store(v, std::memory_order_relaxed);
  }
  return v;
}
uint64_t host_tcp_rmem() {
  static std::atomic<uint64_t> cached{0};
  return cached_sysctl_max(cached, "/proc/sys/net/ipv4/tcp_rmem", 6u << 20);
}
uint64_t host_tcp_buffering() {
  static std::atomic<uint64_t> cached{0};
  return cached_sysctl_max(cached, "/proc/sys/net/ipv4/tcp_wmem", 4u << 20) + host_tcp_rmem();
}

size_t round_up_ring(uint64_t want) {
  size_t size = kDefaultRingSize;
  while (size < want && size < kMaxRingSize) size <<= 1;
  return size;
}

}  // namespace

size_t tcp_equivalent_ring_size(int fd) {
  const Config& cfg = config();
  if (cfg.ring_size_set) return cfg.ring_size;
  uint64_t want = host_tcp_buffering();
  // A program that set SO_SNDBUF / SO_RCVBUF (the kernel reports them
  // doubled) may have asked for more than the autotuning limits.
  int snd = 0, rcv = 0;
  socklen_t len = sizeof snd;
  if (sys::real().getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len) == 0 && (len = sizeof rcv) &&
      sys::real().getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len) == 0 && snd > 0 && rcv > 0 &&
      static_cast<uint64_t>(snd) + static_cast<uint64_t>(rcv) > want) {
    want = static_cast<uint64_t>(snd) + static_cast<uint64_t>(rcv);
  }
  return round_up_ring(want);
}

size_t host_ring_size() {
  const Config& cfg = config();
  return cfg.ring_size_set ? cfg.ring_size : round_up_ring(host_tcp_buffering());
}

size_t ring_size_for_client(int fd, size_t own, uint64_t peer_sndbuf) {
  if (config().ring_size_set || peer_sndbuf == 0) return own;
  uint64_t rcv_max = host_tcp_rmem();
  int rcv = 0;
  socklen_t len = sizeof rcv;
  if (sys::real().getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len) == 0 && static_cast<uint64_t>(rcv) > rcv_max) {
    rcv_max = static_cast<uint64_t>(rcv);
  }
  size_t size = round_up_ring(peer_sndbuf + rcv_max);
  return size > own ? size : own;
}

}  // namespace rdmashim
